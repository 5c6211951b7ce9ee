"""The supported families as a Markdown table, generated from the family rows so the docs cannot drift.

``docs/pretrained.md`` embeds :func:`families_markdown` between the markers
``<!-- families:start -->`` and ``<!-- families:end -->``; a test compares
the two, and ``python -m partitioning.models.hf.catalog docs/pretrained.md``
rewrites the section. Each row lists the family's architectures, its
``config.json`` reader's summary (its docstring), the decoder options that
reader sets for a ``config.json`` holding only the architecture (the
defaults of the family's ``transformers`` config class, sizes left out), and
the tensor names of one layer.

Example::

    >>> from partitioning.models.hf.catalog import decoder_options
    >>> decoder_options("olmo2")
    ['kernel_order: out_in', 'norm_placement: post', 'qk_norm: all']
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from partitioning.models.hf.families import FAMILIES

START, END = "<!-- families:start -->", "<!-- families:end -->"
# Sizes and per-layer lists: what every family reads, not what tells the families apart.
_SIZES = {"vocab_size", "embed", "heads", "kv_heads", "head_dim", "mlp", "layers", "norm_eps", "rope_theta"}


def _defaults() -> dict:
    from partitioning.models.gpt import GPT

    return {x.name: x.default for x in dataclasses.fields(GPT)}


def _options(family: str) -> dict:
    """The GPT options of a ``config.json`` holding only the family's architecture."""
    f = FAMILIES[family]
    return f.options({"architectures": [f.architectures[0]]})


def decoder_options(family: str) -> list[str]:
    """``option: value`` for each GPT option the family's reader sets away from the GPT default."""
    defaults, opts = _defaults(), _options(family)
    out = []
    for k, v in sorted(opts.items()):
        if k in _SIZES or v == defaults.get(k):
            continue
        if k == "layer_types":
            v = f"{sum(t == 'sliding_attention' for t in v)} of {len(v)} sliding"
        elif k == "nope_layers":
            v = f"{len(v)} of {opts['layers']} without RoPE"
        elif k == "moe_layers":
            v = f"{len(v)} of {opts['layers']} sparse"
        elif k == "linear_layers":
            v = f"{len(v)} of {opts['layers']} linear attention"
        elif isinstance(v, dict):
            v = ", ".join(f"{a}={b}" for a, b in v.items())
        elif isinstance(v, float):
            v = f"{v:g}"
        out.append(f"{k}: {v}")
    return out


def _tensors(family: str) -> str:
    """A layer's weight names (those the default options ask for): the last layer's, and for families whose layers
    differ (dense and sparse, linear and full attention) the first's too."""
    from partitioning.models.hf.model import build

    f = FAMILIES[family]
    model = build({"architectures": [f.architectures[0]]})
    prefixes = ("model.layers.{i}.", "transformer.h.{i}.")
    rows = [
        t
        for t in f.tensors
        if "{i}" in t.hf and any(t.wanted(lambda o: getattr(model, o), i) for i in (0, model.layers - 1))
    ]
    names = sorted({t.hf.removeprefix(prefixes[0]).removeprefix(prefixes[1]) for t in rows})
    return ", ".join(f"`{n.removesuffix('.weight')}`" for n in names if n.endswith(".weight"))


def families_markdown() -> str:
    """The table of supported families (see the module docstring)."""
    rows = [
        "| `architectures` | family | what it honours | decoder options by default | a layer's tensors |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, f in FAMILIES.items():
        doc = " ".join((f.options.__doc__ or "").split()).replace("``", "`")
        summary = doc.split(": ", 1)[1] if ": " in doc else doc
        archs = ", ".join(f"`{a}`" for a in f.architectures)
        opts = ", ".join(f"`{o}`" for o in decoder_options(name))
        rows.append(f"| {archs} | {name} | {summary} | {opts} | {_tensors(name)} |")
    return "\n".join(rows) + "\n"


def section(text: str) -> tuple[int, int]:
    """The character span between the markers in ``text`` (ValueError when absent)."""
    start, end = text.index(START) + len(START), text.index(END)
    return start, end


def rewrite(path: str | Path) -> bool:
    """Replaces the generated section of ``path``; True when it changed."""
    p = Path(path)
    text = p.read_text()
    start, end = section(text)
    new = text[:start] + "\n" + families_markdown() + text[end:]
    if new != text:
        p.write_text(new)
    return new != text


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(f"{arg}: {'rewritten' if rewrite(arg) else 'up to date'}")

__all__ = ["families_markdown", "decoder_options", "rewrite", "section", "START", "END"]
