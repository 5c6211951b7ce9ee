#!/usr/bin/env bash
# The GPU benchmark on a fresh single-GPU machine without network (<= 8 minutes on one H100):
#   here, once:        bash benchmarks/gpu/wheels.sh        (the wheels the image lacks, into .whl/)
#   on the machine:    bash benchmarks/gpu/run.sh           (with .whl carried; writes $OUT/gpu.json, gpu.txt, log.txt)
# Installs the project with --no-deps into /tmp/site beside the image's JAX, then runs bench_gpu.py with a time
# budget that leaves the install and the report inside 8 minutes. Extra arguments go to bench_gpu.py.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --target /tmp/site . \
  || exit 2
echo "installed in $(( $(date +%s) - t0 )) s" | tee "$OUT/log.txt"
python3 -P -c "import jax, flax, optax, orbax.checkpoint, partitioning; print('jax', jax.__version__, jax.devices(), partitioning.__file__)" \
  2>&1 | tee -a "$OUT/log.txt"
left=$(( 470 - ($(date +%s) - t0) ))
PYTHONUNBUFFERED=1 timeout $(( left + 20 )) python3 benchmarks/gpu/bench_gpu.py --out "$OUT" --budget-s "$left" "$@" \
  2>&1 | tee -a "$OUT/log.txt"
