"""PEFT's LoRA format as data: ``adapter_config.json`` read and checked, and the adapter rows of a name map.

A PEFT LoRA adapter is ``adapter_config.json`` (``r``, ``lora_alpha``,
``target_modules``, ...) + ``adapter_model.safetensors`` holding, for each
adapted ``torch.nn.Linear`` ``<module>`` of the base model,
``base_model.model.<module>.lora_A.weight`` ``(r, in)`` and
``base_model.model.<module>.lora_B.weight`` ``(out, r)``. Each such pair is
derived from the base weight's row of the family's name map
(:mod:`partitioning.models.hf.tables`): its file axes ``OUT IN`` give
``lora IN`` and ``OUT lora``, its parameter ``P`` gives ``P_lora_a`` and
``P_lora_b`` (the :class:`~partitioning.finetune.LoRA` contract), so the same engine
that reads and writes the base reads and writes the adapters, per shard.

Keys of ``adapter_config.json`` that change what the adapter computes and
that this toolkit does not implement (DoRA, per-module ranks, adapters on
some layers only, extra trainable modules, biases) are refused, one line
naming the key.

Example::

    >>> from partitioning.hf.peft_config import adapter_rows, lora_tensors, read_adapter
    >>> from partitioning.models.hf.families import FAMILIES
    >>> a = read_adapter("tests/fixtures/peft/llama_rslora")
    >>> a.rank, a.alpha, a.rslora, a.target_modules
    (4, 8.0, True, '.*\\\\.(q_proj|v_proj|o_proj|down_proj)')
    >>> rows = adapter_rows(a, FAMILIES["llama"], layers=2, tie_embeddings=False)
    >>> [r.param for r in rows]
    ['{layer}/attn/q', '{layer}/attn/v', '{layer}/attn/o', '{layer}/mlp/wo']
    >>> [(t.hf, t.param, t.axes) for t in lora_tensors(rows[:1])]    # doctest: +NORMALIZE_WHITESPACE
    [('base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight', '{layer}/attn/q_lora_a', 'lora embed'),
     ('base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight', '{layer}/attn/q_lora_b', '(heads kv) lora')]
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from partitioning.errors import CheckpointError
from partitioning.hf.files import read_json_object

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."
EMBEDDINGS = ("embedding", "pos_embedding")

# Keys whose non-default value changes the computation in ways not implemented here: key -> why.
REFUSED = {
    "use_dora": "DoRA (weight-decomposed LoRA)",
    "lora_bias": "a bias in lora_B",
    "modules_to_save": "fully trained extra modules",
    "rank_pattern": "per-module ranks",
    "alpha_pattern": "per-module alphas",
    "layers_to_transform": "adapters on some layers only",
    "layers_pattern": "adapters on some layers only",
    "exclude_modules": "excluded modules",
    "layer_replication": "replicated layers",
    "target_parameters": "adapters on parameters (not modules)",
    "trainable_token_indices": "trainable token embeddings",
    "use_qalora": "QA-LoRA",
    "alora_invocation_tokens": "activated LoRA",
    "megatron_config": "Megatron layers",
    "use_bdlora": "block-diagonal LoRA",
}


@dataclass(frozen=True)
class Adapter:
    """A PEFT LoRA adapter's settings (``adapter_config.json``) and where it is."""

    directory: Path
    rank: int
    alpha: float
    rslora: bool
    dropout: float
    target_modules: str | tuple[str, ...]
    base: str | None

    @property
    def config_file(self) -> Path:
        return self.directory / ADAPTER_CONFIG

    @property
    def weights_file(self) -> Path:
        return self.directory / ADAPTER_WEIGHTS


def _refused(key: str, value: Any) -> bool:
    if key == "use_dora" or key == "lora_bias" or key == "use_qalora":
        return bool(value)
    return value not in (None, {}, [], "", False)


def read_adapter(path: str | os.PathLike) -> Adapter:
    """The adapter in ``path`` (a folder with adapter_config.json, or that file); one line per bad key."""
    p = Path(path)
    file = p if p.name == ADAPTER_CONFIG else p / ADAPTER_CONFIG
    if not file.is_file():
        where = (
            f"{p} does not exist"
            if not p.exists()
            else f"{p} is a file"
            if p.is_file()
            else f"{p} has no {ADAPTER_CONFIG}"
        )
        raise CheckpointError(f"{where}: a PEFT adapter is a folder with {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}")
    cfg = read_json_object(file)
    kind = cfg.get("peft_type")
    if kind != "LORA":
        raise CheckpointError(f"{file}: peft_type {kind!r} is not supported; only LORA adapters load")
    task = cfg.get("task_type")
    if task not in (None, "CAUSAL_LM"):
        raise CheckpointError(f"{file}: task_type {task!r} is not supported; only CAUSAL_LM (a decoder's logits)")
    r, alpha = cfg.get("r"), cfg.get("lora_alpha", cfg.get("r"))
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise CheckpointError(f"{file}: r must be a positive integer, got {r!r}")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not math.isfinite(alpha):
        raise CheckpointError(f"{file}: lora_alpha must be a number, got {alpha!r}")
    if cfg.get("bias", "none") != "none":
        raise CheckpointError(f'{file}: bias {cfg["bias"]!r} is not supported; only "none" (no trained biases)')
    if cfg.get("fan_in_fan_out"):
        raise CheckpointError(f"{file}: fan_in_fan_out true (GPT-2's Conv1D layers) is not supported")
    for key, why in REFUSED.items():
        if _refused(key, cfg.get(key)):
            raise CheckpointError(f"{file}: {key} ({why}) is not supported; got {cfg[key]!r}")
    targets = cfg.get("target_modules")
    if isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets):
        target_modules: str | tuple[str, ...] = tuple(targets)
    elif isinstance(targets, str) and targets:
        try:
            re.compile(targets)
        except re.error as e:
            raise CheckpointError(f"{file}: target_modules {targets!r} is not a valid regex ({e})") from None
        target_modules = targets
    else:
        raise CheckpointError(f"{file}: target_modules must be a list of module names or a regex, got {targets!r}")
    dropout = cfg.get("lora_dropout") or 0.0
    base = cfg.get("base_model_name_or_path")
    return Adapter(
        p if p.is_dir() else p.parent,
        r,
        float(alpha),
        bool(cfg.get("use_rslora")),
        float(dropout),
        target_modules,
        base if isinstance(base, str) else None,
    )


def groups(axes: str) -> list[str]:
    """A row's file axes split at the top level: ``"(heads kv) embed"`` -> ``["(heads kv)", "embed"]``."""
    return re.findall(r"\([^)]*\)|[^\s()]+", axes)


def linear(row: Any) -> bool:
    """The row is a torch ``Linear`` weight (out, in): what LoRA adapts."""
    return row.hf.endswith(".weight") and row.part is None and len(groups(row.axes)) == 2


def module_of(hf: str) -> str:
    return hf[: -len(".weight")]


def _matches(target: str | tuple[str, ...], module: str) -> bool:
    """PEFT's ``check_target_module_exists``: a regex full-matches; a name equals the module or ends it."""
    if isinstance(target, str):
        return re.fullmatch(target, module) is not None
    return any(module == t or module.endswith("." + t) for t in target)


def adapter_rows(adapter: Adapter, family: Any, *, layers: int, tie_embeddings: bool) -> list[Any]:
    """The base rows (of ``family``'s name map) the adapter's ``target_modules`` select, in table order."""
    where = adapter.config_file
    if family.name == "gpt2":
        raise CheckpointError(f"{where}: PEFT adapters of gpt2 (Conv1D, fused c_attn) are not supported")
    rows = [r for r in family.tensors if not (tie_embeddings and r.when == "!tie_embeddings")]
    target = adapter.target_modules
    if target == "all-linear":  # PEFT: every linear layer but the output layer
        return [r for r in rows if linear(r) and r.param not in EMBEDDINGS and r.param != "unembed"]
    picked: list[Any] = []
    used: set[str] = set()
    for r in rows:
        names = [module_of(r.hf.format(i=i)) for i in range(layers)] if "{i}" in r.hf else [module_of(r.hf)]
        hits = [n for n in names if _matches(target, n)]
        if not hits:
            continue
        if not linear(r) or r.param in EMBEDDINGS:
            raise CheckpointError(
                f"{where}: target_modules selects {hits[0]}, which is not a linear layer this toolkit adapts"
            )
        if len(hits) != len(names):
            raise CheckpointError(
                f"{where}: target_modules selects {hits[0]} but not {next(n for n in names if n not in hits)}: "
                f"adapters on some layers only are not supported"
            )
        picked.append(r)
        used.update(t for t in (target if isinstance(target, tuple) else ()) if any(_matches((t,), n) for n in hits))
    unused = [t for t in target if t not in used] if isinstance(target, tuple) else []
    if unused or not picked:
        what = f"{unused[0]!r}" if unused else f"{target!r}"
        raise CheckpointError(f"{where}: target_modules {what} matches no linear layer of the {family.name} model")
    return picked


def lora_tensors(rows: Sequence[Any]) -> list[Any]:
    """The adapter file's rows derived from the base rows: ``lora_A`` (lora, IN), ``lora_B`` (OUT, lora)."""
    from partitioning.models.hf.tables import Tensor

    out = []
    for r in rows:
        out_axes, in_axes = groups(r.axes)
        module = PREFIX + module_of(r.hf)
        out.append(Tensor(module + ".lora_A.weight", r.param + "_lora_a", f"lora {in_axes}", when=r.when))
        out.append(Tensor(module + ".lora_B.weight", r.param + "_lora_b", f"{out_axes} lora", when=r.when))
    return out


def target_regexes(rows: Sequence[Any]) -> tuple[str, ...]:
    """The LoRA ``targets`` (regexes over parameter paths) of these base rows, stacked or per block."""
    return tuple("^" + re.escape(r.param).replace(r"\{layer\}", r"(?:blocks|block_\d+)") + "$" for r in rows)


__all__ = [
    "Adapter",
    "read_adapter",
    "adapter_rows",
    "lora_tensors",
    "target_regexes",
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "PREFIX",
]
