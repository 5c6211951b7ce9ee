"""``partitioning check CONFIG``: the pre-flight — every check ``train`` would make, before any step.

Config, mesh, rules, divisibility of params and batch, data size, writable
``run_dir`` / ``checkpoint.dir``, an existing checkpoint's fit, and the memory
budget. Meshes this process can simulate are checked on real (CPU) devices;
larger ones from shapes alone.
"""

from __future__ import annotations

import argparse
import warnings

from partitioning.cli.args import config_args, load_with_devices, resume_args, say
from partitioning.cli.compiling import IN_PROCESS_MAX, plan_devices
from partitioning.config.hf import check_hf_weights
from partitioning.config.preflight import preflight, preflight_abstract
from partitioning.errors import ConfigError

HELP = "the pre-flight: every check train would make (config, mesh, rules, batch, data, dirs, checkpoint, memory)"
EXAMPLES = """examples:
  partitioning check configs/quickstart.yaml
  partitioning check configs/llama3_70b.yaml --devices 2048 --set mesh.device_memory=80GiB"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    config_args(p)
    resume_args(p, check=True)


def run(args: argparse.Namespace) -> int:
    cfg = load_with_devices(args, simulate=False)
    devices = plan_devices(cfg, args.devices)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if devices <= IN_PROCESS_MAX:
            load_with_devices(args)  # simulate the devices now that the count is known to be small
            ready = preflight(cfg, devices=devices, resume=args.resume)
            mesh = dict(ready.mesh.shape)
        else:
            ready = preflight_abstract(cfg, devices, resume=args.resume)
            mesh = dict(ready.mesh)
    for w in caught:
        if "Indivisible" in type(w.message).__name__ or "divisible" in str(w.message):
            say(f"warning: {w.message}")
    plan = ready.plan
    n_params = plan.num_params
    print(
        f"OK: {cfg.path}: model {cfg.model_name} ({n_params:,} parameters, {len(plan.params)} arrays) "
        f"on mesh {mesh} ({devices} devices) with {len(cfg.rules)} rules"
    )
    if ready.remat_note:
        print(ready.remat_note)
    if ready.budget is not None:
        print(f"memory: {ready.budget.describe()}")
    if ready.resume_step is not None:
        print(f"resume: train would continue from the checkpoint at step {ready.resume_step} in {ready.checkpoint_dir}")
        for note in (getattr(ready, "resume_note", None), ready.data_note):
            if note:
                print(note)
    elif cfg.model_hf is not None:
        try:
            check_hf_weights(cfg)
            print(f"weights: train would start from the Hugging Face weights in {cfg.model_hf}")
        except ConfigError as e:  # planning needs only config.json; say what train would need
            print(f"weights: {str(e).split(': ', 2)[-1]}")
    return 0
