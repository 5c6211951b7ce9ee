"""PEFT LoRA adapters in and out, and LoRA merged into the base weights.

In: ``load_hf(base, mesh, rules, adapter=DIR)`` builds the base model with
``lora`` set from the adapter's ``adapter_config.json`` and reads
``adapter_model.safetensors`` per shard onto the mesh, through the same name
map engine as the base weights (:mod:`~partitioning.hf.peft_config`
derives the adapter rows). Out: :func:`save_peft` writes a LoRA model's
adapters in PEFT's format (``PeftModel.from_pretrained(base, out)`` loads
them); :func:`merge_lora` (:mod:`partitioning.finetune.merge`) folds ``scale * B A`` into each
adapted weight, so ``save_hf(..., merge=True)`` writes a plain checkpoint.

Example::

    >>> import tempfile
    >>> mesh = pt.make_mesh({"data": 1, "fsdp": -1})
    >>> model, variables = pt.hf.load_hf("tests/fixtures/hf/llama", mesh, "fsdp", adapter="tests/fixtures/peft/llama")
    >>> q_lora_b = variables["params"]["blocks"]["attn"]["q_lora_b"]  # (layers, heads, kv, lora)
    >>> model.lora.rank, model.lora.scale, q_lora_b.shape
    (4, 2.0, (2, 4, 8, 4))
    >>> out = pt.hf.save_peft(model, variables, tempfile.mkdtemp() + "/adapter", base="tests/fixtures/hf/llama")
    >>> sorted(f.name for f in out.iterdir())
    ['adapter_config.json', 'adapter_model.safetensors']
    >>> merged_model, merged = pt.finetune.merge_lora(model, variables)
    >>> merged_model.lora, sorted(merged["params"]["blocks"]["attn"])
    (None, ['k', 'o', 'q', 'v'])
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flax import traverse_util

from partitioning.boxes import unbox
from partitioning.errors import CheckpointError, ConfigError
from partitioning.finetune.lora import A_SUFFIX, LoRA
from partitioning.hf.files import read_header
from partitioning.hf.name_map import ParamMap, expand, layer_shape
from partitioning.hf.peft_config import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    EMBEDDINGS,
    Adapter,
    adapter_rows,
    linear,
    lora_tensors,
    module_of,
    read_adapter,
    target_regexes,
)
from partitioning.model.interface import abstract_params as _abstract
from partitioning.model.interface import param_names as _names
from partitioning.outdir import check_out_dir


def lora_of(adapter: Adapter, family: Any, model: Any) -> Any:
    """The :class:`~partitioning.finetune.LoRA` a model needs to hold ``adapter`` (targets from its target_modules)."""
    rows = adapter_rows(adapter, family, layers=model.layers, tie_embeddings=model.tie_embeddings)
    dtype = getattr(LoRA.parse(getattr(model, "lora", None)), "dtype", "float32")
    return LoRA(
        rank=adapter.rank,
        alpha=adapter.alpha,
        targets=target_regexes(rows),
        dropout=adapter.dropout,
        rslora=adapter.rslora,
        dtype=dtype,
    )


def with_adapter(path: str | os.PathLike, family: Any, model: Any) -> tuple[Adapter, list[Any], Any]:
    """``(the adapter, the base rows it adapts, model with its lora set)``."""
    adapter = read_adapter(path)
    rows = adapter_rows(adapter, family, layers=model.layers, tie_embeddings=model.tie_embeddings)
    return adapter, rows, model.clone(lora=lora_of(adapter, family, model))


def _maps(rows: Sequence[Any], model: Any, names: Mapping[tuple[str, ...], tuple[str, ...]]) -> tuple[list, list]:
    return expand(lora_tensors(rows), lambda opt: getattr(model, opt), model.layers, model.scan_layers, names)


def adapter_maps(rows: Sequence[Any], model: Any, names: Mapping[tuple[str, ...], tuple[str, ...]]) -> list[ParamMap]:
    """One :class:`ParamMap` per adapter parameter (``..._lora_a`` / ``..._lora_b``) of the adapted rows."""
    return _maps(rows, model, names)[0]


def match_adapter(
    adapter: Adapter, maps: Sequence[ParamMap], shapes: Mapping[tuple[str, ...], tuple[int, ...]], base: Path
) -> dict[str, Any]:
    """Adapter tensor name -> its stored tensor; one line for a missing, misshaped or unexpected tensor."""
    file = adapter.weights_file
    if not file.is_file():
        pickled = adapter.directory / "adapter_model.bin"
        why = " (adapter_model.bin is a pickle: never loaded; re-save it with safetensors)" if pickled.is_file() else ""
        raise CheckpointError(f"{adapter.directory} has no {ADAPTER_WEIGHTS}{why}")
    stored = read_header(file)
    found = {}
    for m in maps:
        want = m.file_shape(layer_shape(m, shapes[m.path]))
        for name in m.hf:
            s = stored.get(name)
            if s is None:
                raise CheckpointError(
                    f"{file}: tensor {name!r} is missing (adapter_config.json targets {name[17:].rsplit('.', 2)[0]})"
                )
            if s.shape != want:
                raise CheckpointError(
                    f"{file}: tensor {name!r} has shape {list(s.shape)}; {base}/config.json and r={adapter.rank} "
                    f"imply {list(want)} (an adapter made for another base model?)"
                )
            found[name] = s
    for name in sorted(set(stored) - set(found)):
        raise CheckpointError(
            f"{file}: unexpected tensor {name!r}: not a LoRA weight of the modules adapter_config.json targets"
        )
    return found


def _adapted_rows(model: Any, family: Any, flat: Mapping[tuple[str, ...], Any]) -> list[Any]:
    """The rows of ``family`` whose weight carries adapters in ``flat``; every adapter must have a row."""
    covered: set[tuple[str, ...]] = set()
    rows = []
    layer_names = ["blocks"] if model.scan_layers else [f"block_{i}" for i in range(model.layers)]
    for r in family.tensors:
        paths = [tuple(r.param.format(layer=n).split("/")) for n in (layer_names if "{layer}" in r.param else [""])]
        a_paths = [p[:-1] + (p[-1] + A_SUFFIX,) for p in paths]
        if not any(p in flat for p in a_paths):
            continue
        if r.param in EMBEDDINGS or not linear(r):
            raise ConfigError(f"parameter {r.param} has adapters PEFT's LoRA format has no name for (not a Linear)")
        rows.append(r)
        covered.update(a_paths)
    for path in flat:
        if path[-1].endswith(A_SUFFIX) and path not in covered:
            raise ConfigError(f"parameter {'/'.join(path)}: an adapter PEFT's format has no name for")
    return rows


def _alpha(value: float) -> float | int:
    return int(value) if float(value).is_integer() else float(value)


def peft_config(lora: Any, rows: Sequence[Any], base: str | None) -> dict[str, Any]:
    """The ``adapter_config.json`` PEFT writes for a LoRA of these rows (target_modules by their short names)."""
    modules = sorted({module_of(r.hf).rsplit(".", 1)[-1] for r in rows})
    return {
        "alpha_pattern": {},
        "base_model_name_or_path": base,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "layers_pattern": None,
        "layers_to_transform": None,
        "lora_alpha": _alpha(lora.alpha if lora.alpha is not None else lora.rank),
        "lora_dropout": float(lora.dropout),
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": int(lora.rank),
        "rank_pattern": {},
        "target_modules": modules,
        "task_type": "CAUSAL_LM",
        "use_dora": False,
        "use_rslora": bool(lora.rslora),
    }


def _family_of(model: Any) -> Any:
    import partitioning.models.hf as families

    return families.family_of(families.export_config(model))


def save_peft(model: Any, variables: Any, out_dir: str | os.PathLike, *, base: str | None = None) -> Path:
    """Writes a LoRA model's adapters as a PEFT adapter (``adapter_config.json`` + ``adapter_model.safetensors``).

    ``model`` is a Hugging Face family's decoder with ``lora`` set (e.g. from :func:`partitioning.hf.load_hf`
    with ``adapter=``, or a LoRA run); ``base`` is recorded as ``base_model_name_or_path``. Tensor names
    and shapes are PEFT's (``base_model.model.<module>.lora_A.weight`` ``(r, in)``, ``lora_B.weight``
    ``(out, r)``), in the adapters' dtype; each tensor is gathered alone and the folder changes only
    when both files are complete, as with :func:`partitioning.hf.save_hf`; ``out_dir`` is new, empty, or
    holds an adapter to replace.

    Example::

        >>> import tempfile, json
        >>> model, variables = pt.hf.load_hf("tests/fixtures/hf/qwen2", adapter="tests/fixtures/peft/qwen2")
        >>> out = pt.hf.save_peft(model, variables, tempfile.mkdtemp() + "/adapter", base="Qwen/Qwen2-0.5B")
        >>> cfg = json.loads((out / "adapter_config.json").read_text())
        >>> cfg["r"], cfg["lora_alpha"], cfg["target_modules"][:3], cfg["base_model_name_or_path"]
        (4, 8, ['down_proj', 'gate_proj', 'k_proj'], 'Qwen/Qwen2-0.5B')
    """
    from partitioning.hf.write import save_tensors

    check_out_dir(out_dir, "out_dir", replaceable=lambda d: (d / ADAPTER_CONFIG).is_file(), kind="a PEFT adapter")
    lora = LoRA.parse(getattr(model, "lora", None))
    if lora is None:
        raise ConfigError(f"{type(model).__name__} has no LoRA adapters (lora is not set); save_hf writes its weights")
    params = variables.get("params", variables) if hasattr(variables, "get") else variables
    flat = traverse_util.flatten_dict(unbox(params))
    rows = _adapted_rows(model, _family_of(model), flat)
    if not rows:
        raise ConfigError("the params hold no LoRA adapters (no `..._lora_a` parameter)")
    maps, order = _maps(rows, model, _names(_abstract(model)))
    for m in maps:
        if m.path not in flat:
            raise CheckpointError(f"parameter {'/'.join(m.path)} is missing from the params")
    out = Path(out_dir)
    text = json.dumps(peft_config(lora, rows, base), indent=2, sort_keys=True) + "\n"
    save_tensors(
        maps, order, flat, out, max_shard_size=1 << 62, extra_files={ADAPTER_CONFIG: text}, file_name=ADAPTER_WEIGHTS
    )
    return out


__all__ = ["save_peft", "with_adapter", "adapter_maps", "match_adapter", "lora_of", "peft_config"]
