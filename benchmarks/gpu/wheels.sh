#!/usr/bin/env bash
# Fills .whl/ (git-ignored, at the repository root) with the wheels the GPU machine's image lacks, for Python 3.12
# on x86-64: the project's dependencies that are not in the image (its JAX, flax, optax, orbax-checkpoint,
# tensorstore, numpy, rich, tqdm, matplotlib, safetensors, jinja2 are used as they are). Run it here, once:
#   bash benchmarks/gpu/wheels.sh
# then carry `.whl` to the GPU machine with the repository and run benchmarks/gpu/run.sh there.
set -euo pipefail
cd "$(dirname "$0")/../.."
WANT=(
  "pydantic==2.14.4" "pydantic-core==2.50.5" "annotated-types==0.8.0" "typing-inspection==0.4.5"
  "ruamel.yaml==0.19.1" "typing-extensions==4.16.0" "crc32c==2.9.post0" "tensorboardX==2.6.5" "setuptools==80.9.0" "wheel==0.45.1"
)
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl "${WANT[@]}"
du -sh .whl && ls .whl
