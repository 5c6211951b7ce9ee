"""Hugging Face checkpoints in and out: ``load_hf``, ``save_hf``, ``hf_model``, ``hf_family``.

A published checkpoint (``config.json`` + safetensors) is a model family
(:mod:`partitioning.models.hf`) plus a name map. Loading builds the family's
decoder from ``config.json``, lays out its parameters with the rules on the
mesh, and has each process read only the bytes of the shards its devices
hold (:mod:`~partitioning.hf.read`). Saving gathers one file
tensor at a time (:mod:`~partitioning.hf.write`). The families
are imported inside these functions: ``import partitioning`` loads no
reference model.

Example::

    >>> import pathlib, tempfile
    >>> mesh = pt.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    >>> model, variables = pt.hf.load_hf("tests/fixtures/hf/llama", mesh, "fsdp_tp")
    >>> pt.hf.hf_family("tests/fixtures/hf/llama"), variables["params"]["blocks"]["mlp"]["wi_0"].sharding.spec
    ('llama', P(None, 'tensor', 'fsdp'))
    >>> out = pt.hf.save_hf(model, variables, pathlib.Path(tempfile.mkdtemp()) / "llama")
    >>> sorted(f.name for f in out.iterdir())
    ['config.json', 'model.safetensors']
    >>> _, again = pt.hf.load_hf(out)             # the same numbers back, on one device this time
    >>> jax.tree.all(jax.tree.map(lambda a, b: bool((np.asarray(a) == np.asarray(b)).all()), variables, again))
    True
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from partitioning.boxes import unbox
from partitioning.context import get_logical_axis_rules
from partitioning.errors import CheckpointError, ConfigError
from partitioning.finetune.lora import LoRA, is_adapter
from partitioning.finetune.quantize import SCALE_SUFFIX, quantize, quantized_paths
from partitioning.finetune.quantized_base import without_base_dtype
from partitioning.hf.check import arch_hint, check_config_keys, check_hf_path
from partitioning.hf.files import DTYPES, discover, parse_size, read_config
from partitioning.hf.name_map import check_params, expand, match
from partitioning.hf.name_map import expert_count as _experts
from partitioning.hf.read import Reader
from partitioning.hf.write import save_tensors
from partitioning.layout import tree_shardings
from partitioning.mesh import sharding_context
from partitioning.model.interface import abstract_params as _abstract
from partitioning.model.interface import param_names as _names
from partitioning.outdir import check_out_dir

# Errors about the caller's own arguments, not about config.json.
_ARGS = {"dtype", "param_dtype", "remat", "scan_layers", "capacity_factor", "attention", "context_parallel"}


def _families() -> Any:
    # Loading a published checkpoint means building its family: the one place outside the
    # config build step that imports the reference models, and only when called.
    import partitioning.models.hf as families

    return families


def _config(path: str | os.PathLike) -> tuple[Path, dict[str, Any], Any]:
    check_hf_path(path)  # a weights or tokenizer file given for the folder: said as such
    directory, cfg = read_config(path)
    check_config_keys(directory / "config.json", cfg)  # wrong types, typo'd keys (hf_check.py)
    try:
        return directory, cfg, _families().family_of(cfg)
    except ConfigError as e:
        hint = arch_hint(cfg, _families().ARCHITECTURES)
        raise CheckpointError(f"{directory / 'config.json'}: {e}{hint}") from None


def hf_family(path_or_dir: str | os.PathLike) -> str:
    """A checkpoint's family (``llama``, ``mistral``, ``qwen2``, ``gemma``, ``gpt2``), from its ``config.json``.

    Example::

        >>> pt.hf.hf_family("tests/fixtures/hf/qwen2")
        'qwen2'
    """
    return _config(path_or_dir)[2].name


def hf_model(
    path_or_dir: str | os.PathLike,
    *,
    dtype: str | None = None,
    param_dtype: str | None = None,
    scan_layers: bool = True,
    remat: str = "none",
    lora: Any = None,
    capacity_factor: float | None = None,
    attention: str = "xla",
    context_parallel: str = "auto",
) -> Any:
    """The Flax module a checkpoint's ``config.json`` describes, without reading any weights.

    Enough for ``plan`` / ``tune``: plan Llama-3.1-70B from its ``config.json`` alone.
    ``dtype`` / ``param_dtype`` default to float32; ``lora`` (a :class:`~partitioning.finetune.LoRA` or its
    mapping) adds LoRA adapters (:mod:`partitioning.models.lora`).
    A mixture of experts (Mixtral, Qwen3-MoE) routes dropless unless ``capacity_factor`` caps each expert's
    tokens per sequence.

    Example::

        >>> model = pt.hf.hf_model("tests/fixtures/hf/gemma/config.json")
        >>> model.head_dim, model.norm, model.tie_embeddings
        (12, 'rms_offset', True)
    """
    directory, cfg, _ = _config(path_or_dir)
    lora = LoRA.parse(lora)  # a bad option is the caller's, not config.json's
    try:
        return _families().build(
            cfg,
            dtype=dtype,
            param_dtype=param_dtype,
            scan_layers=scan_layers,
            remat=remat,
            capacity_factor=capacity_factor,
            lora=lora,
            attention=attention,
            context_parallel=context_parallel,
        )
    except ConfigError as e:
        if e.arg in _ARGS:
            raise
        raise CheckpointError(f"{directory / 'config.json'}: {e}") from None


def load_hf(
    path: str | os.PathLike,
    mesh: jax.sharding.Mesh | None = None,
    rules: Any = None,
    *,
    adapter: str | os.PathLike | None = None,
    dtype: str | None = None,
    param_dtype: str | None = None,
    scan_layers: bool = True,
    remat: str = "none",
    on_indivisible: str = "replicate",
    lora: Any = None,
    capacity_factor: float | None = None,
    attention: str = "xla",
    context_parallel: str = "auto",
) -> tuple[Any, dict[str, Any]]:
    """``(model, {"params": ...})`` from a Hugging Face checkpoint, every array born in its shard.

    ``rules``: a :class:`Rules`, preset name or pairs; ``None`` takes the rule context in force,
    else the ``fsdp`` preset. Without a ``mesh`` the arrays are on the first local device. Each
    process reads only the bytes of its devices' shards; ``.safetensors`` in float32, bfloat16 or
    float16 are cast to ``param_dtype`` (default float32). ``model.apply(variables, tokens)`` gives
    the logits ``transformers`` gives. A dimension the mesh does not divide (a vocabulary of 32,001
    on 8 devices) is replicated along that axis with a warning; ``on_indivisible="error"`` refuses it.
    ``lora`` adds fresh LoRA adapters (``lora_b`` zero: the logits stay the checkpoint's), each born in
    its shard too. ``adapter``: a PEFT LoRA adapter folder (``adapter_config.json`` +
    ``adapter_model.safetensors``) for this base; the model gets its ``lora`` from the adapter's
    config and the params its ``lora_A`` / ``lora_B`` (read per shard too), so the logits are
    ``PeftModel``'s (:mod:`~partitioning.hf.peft`).

    Example::

        >>> mesh = pt.make_mesh({"data": 1, "fsdp": -1})
        >>> model, variables = pt.hf.load_hf("tests/fixtures/hf/llama", mesh, "fsdp")
        >>> variables["params"]["blocks"]["attn"]["q"].sharding.spec  # (layers, heads, kv, embed)
        P(None, None, None, 'fsdp')
    """
    model = hf_model(
        path,
        dtype=dtype,
        param_dtype=param_dtype,
        scan_layers=scan_layers,
        remat=remat,
        capacity_factor=capacity_factor,
        lora=lora,
        attention=attention,
        context_parallel=context_parallel,
    )
    directory, cfg, family = _config(path)
    rows: list[Any] = []
    if adapter is not None:
        from partitioning.hf.peft import adapter_maps, match_adapter, with_adapter

        peft_adapter, rows, model = with_adapter(adapter, family, model)
    stored = discover(directory)
    # A quantized base (QLoRA) is read as the float model's and each kernel quantized as soon as it is read.
    plain = without_base_dtype(model)
    abstract = _abstract(plain)
    if mesh is None:
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

        def place(tree: Any) -> Any:
            return jax.tree.map(lambda _: device, unbox(tree))
    else:
        if rules is None:
            rules = get_logical_axis_rules()
            rules = rules if len(rules) else "fsdp"

        def place(tree: Any) -> Any:
            return tree_shardings(tree, mesh, rules, on_indivisible=on_indivisible)

    shardings = place(abstract)
    flat = traverse_util.flatten_dict(unbox(abstract))
    flat_shardings = traverse_util.flatten_dict(shardings)
    qshardings = flat_shardings if plain is model else traverse_util.flatten_dict(place(_abstract(model)))
    quantized = set(quantized_paths(qshardings))
    maps, shapes, all_shapes, all_names, fresh = weight_maps(plain, family, stored, abstract)
    adapters = {k: flat_shardings[k] for k in fresh}
    extra = family.skipped(cfg) + ((r"^lm_head\.weight$",) if model.tie_embeddings else ())
    found = match(maps, shapes, stored, aliases=family.aliases, extra=extra, where=str(directory))
    if adapter is not None:  # the adapters come from the PEFT file, not a fresh init
        lora_maps = adapter_maps(rows, model, all_names)
        found.update(match_adapter(peft_adapter, lora_maps, all_shapes, directory))
        maps, shapes, adapters = maps + lora_maps, all_shapes, {}
    check_params(maps, shapes, family.name)
    params = {}
    with Reader() as reader:
        for m in maps:
            sources = [found[n] for n in m.hf]
            w = reader.param(m, sources, shapes[m.path], flat[m.path].dtype, flat_shardings[m.path])
            if m.path in quantized:
                params.update(quantize_param(m.path, w, LoRA.parse(model.lora), qshardings))
                del w  # one weight unquantized at a time
            else:
                params[m.path] = w
    if adapters:
        params.update(_fresh_adapters(model, adapters, mesh, rules))
    return model, {"params": traverse_util.unflatten_dict(params)}


def quantize_param(path: tuple[str, ...], w: jax.Array, lora: Any, shardings: dict) -> dict[tuple, jax.Array]:
    """``{path: codes, path_qscale: scale}`` of one read weight, each on its sharding (blocks stay on their device)."""
    scale_path = path[:-1] + (path[-1] + SCALE_SUFFIX,)
    fn = functools.partial(quantize, kind=lora.base_dtype, block=lora.base_block)
    codes, scale = jax.jit(fn, out_shardings=(shardings[path], shardings[scale_path]))(w)
    return {path: codes, scale_path: scale}


def weight_maps(model: Any, family: Any, stored: Any, abstract: Any) -> tuple[list[Any], dict, dict, dict, set]:
    """What a checkpoint must hold for ``model``: ``(name maps, their params' shapes, every param's shape, every
    param's logical names, the LoRA adapter paths)``. Adapters are not in a base checkpoint's files (they come
    fresh or from a PEFT adapter); transformers 5's fused-experts files take the family's fused map. One function
    for :func:`load_hf` and the pre-flight's :func:`check_hf_files`, so both
    ask the files for the same tensors."""
    flat = traverse_util.flatten_dict(unbox(abstract))
    adapters = {k for k in flat if is_adapter("/".join(k))}
    all_shapes = {k: tuple(v.shape) for k, v in flat.items()}
    all_names = _names(abstract)
    shapes = {k: v for k, v in all_shapes.items() if k not in adapters}
    names = {k: v for k, v in all_names.items() if k not in adapters}
    tensors = family.tensors
    if getattr(family, "fused", ()) and any(n.endswith(".mlp.experts.gate_up_proj") for n in stored):
        tensors = family.fused  # transformers 5's fused experts (save_original_format=False)
    maps, _ = expand(tensors, lambda opt: getattr(model, opt), model.layers, model.scan_layers, names, _experts(model))
    return maps, shapes, all_shapes, all_names, adapters


def check_hf_files(path: str | os.PathLike, adapter: str | os.PathLike | None = None, **options: Any) -> Path:
    """Every check :func:`~partitioning.hf.load_hf` makes before reading weights; returns the checkpoint folder.

    ``options``: ``dtype``, ``param_dtype``, ``scan_layers``, ``remat`` as for ``load_hf``; ``adapter``: a PEFT
    adapter folder, whose tensors are checked against the base too (an adapter made for another base).
    """
    model = without_base_dtype(hf_model(path, **options))  # the files hold the float weights
    directory, cfg, family = _config(path)
    stored = discover(directory)  # reads and validates every header (truncation, damage)
    maps, shapes, *_ = weight_maps(model, family, stored, _abstract(model))
    check_params(maps, shapes, family.name)
    extra = family.skipped(cfg) + ((r"^lm_head\.weight$",) if model.tie_embeddings else ())
    match(maps, shapes, stored, aliases=family.aliases, extra=extra, where=str(directory))
    if adapter is not None:  # as load_hf reads it: its tensors' names and shapes against the base's
        from partitioning.hf.peft import adapter_maps, match_adapter, with_adapter

        peft_adapter, rows, adapted = with_adapter(adapter, family, model)
        _, _, all_shapes, all_names, _ = weight_maps(adapted, family, stored, _abstract(adapted))
        match_adapter(peft_adapter, adapter_maps(rows, adapted, all_names), all_shapes, directory)
    return directory


def _fresh_adapters(model: Any, shardings: dict[tuple[str, ...], Any], mesh: Any, rules: Any) -> dict[tuple, Any]:
    """The model's initial LoRA adapters, each born in its shard (the rest of the init is dead code to XLA)."""

    # The tokens only trace the init (its forward pass is dead code), but on Explicit mesh axes their batch
    # and length must divide over the axes the rules give them: one token per device on each does.
    n = mesh.size if mesh is not None else 1

    def init(rng):
        flat = traverse_util.flatten_dict(unbox(model.init(rng, jnp.zeros((n, n), jnp.int32))["params"]))
        return {"/".join(k): flat[k] for k in shardings}

    out = {"/".join(k): s for k, s in shardings.items()}
    with sharding_context(mesh, rules) if mesh is not None else contextlib.nullcontext():
        made = jax.jit(init, out_shardings=out)(jax.random.key(0))
    return {k: made["/".join(k)] for k in shardings}


def save_hf(
    model: Any,
    variables: Any,
    out_dir: str | os.PathLike,
    *,
    max_shard_size: int | str = "5GB",
    dtype: Any = None,
    merge: bool = False,
) -> Path:
    """Writes ``model``'s parameters as a Hugging Face checkpoint ``transformers`` loads; returns ``out_dir``.

    ``config.json`` is the one the model was loaded with (a plain ``GPT`` is written as
    ``LlamaForCausalLM``); weights go to ``model.safetensors``, or to
    ``model-0000k-of-0000n.safetensors`` + an index past ``max_shard_size`` (``"5GB"``, ``"500MB"``,
    or bytes), in ``dtype`` (default: the parameters'). Tied output weights are not written. Each
    tensor is gathered alone (multi-process: process 0 writes); the directory changes only when
    every file is complete. ``out_dir`` is new, empty, or holds a checkpoint to replace (anything
    else is refused before a file is written). A model with LoRA adapters is written with ``merge=True`` only: each
    adapted weight as ``W + scale * B A`` (:func:`partitioning.finetune.merge_lora`); :func:`partitioning.hf.save_peft`
    writes the adapters themselves.

    Example::

        >>> import tempfile
        >>> model, variables = pt.hf.load_hf("tests/fixtures/hf/gpt2")
        >>> out = pt.hf.save_hf(model, variables, tempfile.mkdtemp() + "/gpt2", dtype="bfloat16")
        >>> sorted(f.name for f in out.iterdir())
        ['config.json', 'model.safetensors']
    """
    check_out_dir(out_dir, "out_dir", replaceable=_holds_hf, kind="a Hugging Face checkpoint")
    if getattr(model, "lora", None) is not None:
        if not merge:
            raise ConfigError(
                "the model has LoRA adapters: save_peft(model, variables, out) writes them in PEFT's format, "
                "save_hf(..., merge=True) writes the merged weights (W + scale * B A)",
                arg="merge",
            )
        from partitioning.finetune.merge import merge_lora

        model, variables = merge_lora(model, variables)
    families = _families()
    cfg = families.export_config(model)
    family = families.family_of(cfg)
    if dtype is not None and (
        not isinstance(dtype, str | np.dtype | type) or jnp.dtype(dtype) not in map(np.dtype, DTYPES.values())
    ):
        raise ConfigError(f"dtype must be one of float32, bfloat16, float16, float64; got {dtype!r}", arg="dtype")
    params = variables.get("params", variables) if hasattr(variables, "get") else variables
    flat = traverse_util.flatten_dict(unbox(params))
    shapes = {k: tuple(v.shape) for k, v in flat.items()}
    abstract = _abstract(model)
    maps, order = expand(
        family.tensors,
        lambda opt: getattr(model, opt),
        model.layers,
        model.scan_layers,
        _names(abstract),
        _experts(model),
    )
    check_params(maps, shapes, family.name)
    want = traverse_util.flatten_dict(unbox(abstract))
    for k, v in want.items():
        if shapes[k] != tuple(v.shape):
            raise CheckpointError(f"parameter {'/'.join(k)} has shape {list(shapes[k])}; the model has {list(v.shape)}")
    out_dtype = jnp.dtype(dtype) if dtype is not None else np.dtype(next(iter(flat.values())).dtype)
    cfg = dict(cfg)
    keys = [k for k in ("dtype", "torch_dtype") if k in cfg] or ["torch_dtype"]
    cfg.update({k: str(out_dtype) for k in keys})
    out = Path(out_dir)
    save_tensors(
        maps,
        order,
        flat,
        out,
        max_shard_size=parse_size(max_shard_size),
        dtype=out_dtype if dtype is not None else None,
        extra_files={"config.json": json.dumps(cfg, indent=2) + "\n"},
    )
    return out


def _holds_hf(folder: Path) -> bool:
    """An earlier save (or a published checkpoint) that save_hf replaces: config.json and safetensors."""
    return (folder / "config.json").is_file() and any(folder.glob("model*.safetensors"))


__all__ = ["load_hf", "save_hf", "hf_model", "hf_family"]
