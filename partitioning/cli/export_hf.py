"""``partitioning ckpt export-hf RUN_DIR OUT_DIR [--step N] [--force]``: a run back out as a Hugging Face checkpoint.

The run must have started from a Hugging Face checkpoint (``model: {hf: ...}``):
its checkpoints record that checkpoint's ``config.json`` and the model options,
so the model is rebuilt without the source folder. The params (only) are
restored onto the mesh and rules the run saved with, then written by
:func:`partitioning.hf.save_hf` (``config.json`` + safetensors, one tensor
gathered at a time); the run's tokenizer is written beside them as transformers 5 saves it
(:func:`partitioning.hf.save_tokenizer`: ``tokenizer.json``, ``tokenizer_config.json``,
``chat_template.jinja`` -- the template the run trained with -- and ``generation_config.json``).
Everything is written into a temporary folder next to ``OUT_DIR`` and renamed at the end, so a failed
export leaves nothing behind.

A LoRA run (``model.lora``, or ``model.adapter``) is written as a PEFT
adapter (``adapter_config.json`` + ``adapter_model.safetensors``, loadable by
``PeftModel.from_pretrained`` on the base; :func:`partitioning.hf.save_peft`): only the
adapters are read, so the run's frozen base need not be there;
``--merge`` writes the merged full weights (``W + scale * B A``) as a plain
Hugging Face checkpoint instead, with the tokenizer files (a missing or foreign base is refused).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from partitioning.errors import CheckpointError
from partitioning.outdir import check_out_dir


def _check_out(out: Path, force: bool) -> None:
    check_out_dir(out, "OUT_DIR", force="--force", replaceable=lambda _: force)


def _restore_params(ref: Any, meta: dict[str, Any], model: Any, adapters: bool = False) -> Any:
    """The checkpoint's params on the mesh and rules it was saved with (simulated CPU devices if needed).

    ``adapters``: the LoRA adapters alone, the step's own arrays (the frozen base is not read, nor needed)."""
    import jax

    from partitioning.checkpoint.restore import abstract_target, restore_checkpoint
    from partitioning.devices import simulate_devices
    from partitioning.finetune.lora import is_adapter
    from partitioning.finetune.trainable import split_tree
    from partitioning.mesh import make_mesh
    from partitioning.model.interface import as_model
    from partitioning.rules import Rules

    saved_mesh = meta.get("mesh") or {}
    n = int(saved_mesh.get("devices") or 1)
    names, shape = saved_mesh.get("axis_names") or ["fsdp"], saved_mesh.get("shape") or [n]
    simulate_devices(n)  # CPU: as many as the run had; an accelerator host keeps its own
    sizes = dict(zip(names, shape, strict=True))
    if jax.device_count() < n:  # fewer accelerators than the run: read everything onto one device
        sizes, n = {a: 1 for a in names}, 1
    mesh = make_mesh(sizes, devices=jax.devices()[:n])
    rules = Rules.parse(meta["rules"] if meta.get("rules") else "fsdp")
    tokens = jax.ShapeDtypeStruct((1, 8), jax.numpy.int32)
    abstract = as_model(model).abstract((tokens,), {})["params"]
    if adapters:
        abstract = split_tree(abstract, is_adapter)[0]
    on_indivisible = (meta.get("config") or {}).get("on_indivisible", "error")
    target = abstract_target(abstract, mesh, rules, on_indivisible=on_indivisible)
    return restore_checkpoint(ref.path, target, params_only=True, frozen=not adapters)


def export_hf(
    run_dir: str, out_dir: str, *, step: int | None = None, force: bool = False, merge: bool = False
) -> tuple[int, Path, list]:
    """Writes step ``step`` (default: the latest) of a run as a Hugging Face checkpoint into ``out_dir``.

    A LoRA run is written as a PEFT adapter, or with ``merge`` as merged full weights.
    Returns (step, out_dir, the files written). Raises :class:`CheckpointError`
    for a run that did not start from a Hugging Face checkpoint, a missing run
    or step, or an ``out_dir`` that exists and is not empty (unless ``force``).
    """
    from partitioning.checkpoint.disk import read_metadata, resolve_checkpoint
    from partitioning.hf.peft import save_peft
    from partitioning.hf.tokenizer import save_tokenizer
    from partitioning.hf.weights import hf_model, save_hf

    out = Path(out_dir)
    if not Path(run_dir).exists():
        raise CheckpointError(f"{run_dir}: no such run dir")
    ref = resolve_checkpoint(run_dir, step, base=merge)  # a PEFT adapter is the step's own arrays: no base needed
    meta = read_metadata(ref)
    hf = meta.get("hf")
    if not hf:
        raise CheckpointError(
            f"{run_dir}: this run did not start from a Hugging Face checkpoint (model: {{hf: DIR}}); "
            f"export-hf writes only those back out"
        )
    lora = (hf.get("options") or {}).get("lora")
    if merge and not lora:
        raise CheckpointError(
            f"--merge: {run_dir} has no LoRA adapters (model.lora or model.adapter); export-hf writes its full "
            f"weights without --merge"
        )
    _check_out(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".export", dir=out.parent))
    try:
        (tmp / "source").mkdir()
        (tmp / "source" / "config.json").write_text(json.dumps(hf["config"]))
        model = hf_model(tmp / "source", **hf.get("options", {}))
        shutil.rmtree(tmp / "source")
        params = _restore_params(ref, meta, model, adapters=bool(lora) and not merge)
        if lora and not merge:
            save_peft(model, {"params": params}, tmp / "out", base=hf.get("source"))
        else:
            save_hf(model, {"params": params}, tmp / "out", merge=merge)
        tokenizer = hf.get("tokenizer")
        source = Path(tokenizer).parent if tokenizer else Path(hf.get("source", ""))
        if not lora or merge:  # an adapter is used with its base's tokenizer
            trained = (hf.get("chat_template") or {}).get("template")  # the template the run trained with
            save_tokenizer(source, tmp / "out", chat_template=trained, config=hf["config"])
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        os.replace(tmp / "out", out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ref.step if ref.step is not None else int(meta.get("step", 0)), out, sorted(p.name for p in out.iterdir())


def cmd_export_hf(args: argparse.Namespace) -> int:
    step, out, files = export_hf(args.run_dir, args.out_dir, step=args.step, force=args.force, merge=args.merge)
    kind = " (LoRA merged)" if args.merge else " (PEFT adapter)" if "adapter_config.json" in files else ""
    print(f"exported step {step} of {args.run_dir} to {out}{kind}: {', '.join(files)}")
    return 0


def add_parser(sub: Any) -> None:
    ex = sub.add_parser(
        "export-hf", help="write a run that started from a Hugging Face checkpoint back out in that format"
    )
    ex.add_argument("run_dir", help="the run dir (or its checkpoints dir, or a step dir)")
    ex.add_argument("out_dir", help="the folder to write: config.json, *.safetensors, tokenizer files")
    ex.add_argument("--step", type=int, default=None, help="a step other than the latest")
    ex.add_argument("--force", action="store_true", help="replace OUT_DIR when it exists and is not empty")
    ex.add_argument(
        "--merge",
        action="store_true",
        help="a LoRA run: write the merged full weights (W + scale * B A), not a PEFT adapter",
    )


__all__ = ["export_hf", "cmd_export_hf", "add_parser"]
