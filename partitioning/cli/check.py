"""``partitioning check CONFIG``: the pre-flight — every check ``train`` would make, before any step.

Config, mesh, rules, divisibility of params and batch, data size, writable
``run_dir`` / ``checkpoint.dir``, an existing checkpoint's fit, and the memory
budget. Meshes this process can simulate are checked on real (CPU) devices;
larger ones from shapes alone.
"""

from __future__ import annotations

import argparse
import warnings

from partitioning.cli.args import config_args, load_with_devices, resume_args, resume_of, say
from partitioning.cli.compiling import IN_PROCESS_MAX, plan_devices
from partitioning.cli.faults import RunLocks
from partitioning.cli.preflight import pre_flight
from partitioning.cli.render import nodes_line
from partitioning.config.preflight import RunComplete
from partitioning.plan.axes import node_layout

HELP = "the pre-flight: every check train would make (config, mesh, rules, batch, data, dirs, checkpoint, memory)"
EXAMPLES = """examples:
  partitioning check configs/quickstart.yaml
  partitioning check configs/llama3_70b.yaml --devices 2048 --set mesh.device_memory=80GiB"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    config_args(p)
    resume_args(p, check=True)
    p.add_argument("--no-progress", action="store_true", help="tokenizing data says nothing until it is done")


def run(args: argparse.Namespace) -> int:
    cfg = load_with_devices(args, simulate=False)
    devices = plan_devices(cfg, args.devices)
    resume = resume_of(args)
    complete: RunComplete | None = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        small = devices <= IN_PROCESS_MAX
        if small:
            load_with_devices(args)  # simulate the devices now that the count is known to be small
        # The pre-flight `train` runs, every problem at once (cli/preflight.py): the first is train's line.
        ready, problems = pre_flight(
            cfg,
            RunLocks(),
            devices=devices,
            resume=resume,
            resume_from=args.resume_from,
            abstract_devices=None if small else devices,
            every=True,
            measure=False,  # a check says what train would pick, in seconds: it times nothing
            progress=not args.no_progress,
        )
    for p in problems:
        if isinstance(p, RunComplete):
            complete, ready = p, p.ready
    # One problem found by two checks (a config.json typo fails the weights and the model) is said once.
    problems = list({str(p): p for p in problems if not isinstance(p, RunComplete)}.values())
    if problems:
        for p in problems[:-1]:
            say(f"error: {p}")
        raise problems[-1]  # the CLI's own one line and exit status 2
    assert ready is not None
    for w in caught:  # through the CLI's printer: one line per parameter, not one per optimizer moment
        if "Indivisible" in type(w.message).__name__ or "divisible" in str(w.message):
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    mesh = dict(ready.mesh.shape) if small else dict(ready.mesh)
    plan = ready.plan
    if complete is not None:
        print(f"config OK; {ready.run_dir} is complete at step {complete.step} (train would do nothing)")
        return 0
    print(
        f"OK: {cfg.path}: model {cfg.model_name} ({plan.num_params:,} parameters, {len(plan.params)} arrays) "
        f"on mesh {mesh} ({devices} devices) with {len(cfg.rules)} rules"
    )
    if cfg.mesh.nodes:
        print(nodes_line(node_layout(mesh, cfg.mesh.nodes)))
    for line in ready.default_notes:
        print(line)
    if small and getattr(ready.train_batches, "note", None):
        print(ready.train_batches.note)  # how the rows are packed and cut, as `train` says it
    if ready.data_warning:
        say(f"warning: {ready.data_warning}")
    if ready.budget is not None:
        print(f"memory: {ready.budget.describe()}")
    if ready.host is not None:
        print(f"memory: {ready.host.describe()}")
    if ready.resume_step is not None:
        print(f"resume: train would continue from the checkpoint at step {ready.resume_step} in {ready.checkpoint_dir}")
        for note in (ready.resume_note, ready.data_note):
            if note:
                print(note)
    elif cfg.model_hf is not None:
        print(f"weights: train would start from the Hugging Face weights in {cfg.model_hf}")
    return 0
