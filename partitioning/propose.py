"""Proposing an annotation table for a model nobody annotated, from the model's own sizes.

What ``partitioning annotate`` prints. Rules of thumb, each choice with its reason:

- the *residual width* is the size most 2-D (and 3-D) weights share: ``embed``;
- the *vocabulary* is the other side of an embedding table: ``vocab``;
- the *widest hidden* size wider than the residual width that meets it in a
  weight: ``mlp``;
- 3-D attention kernels ``(width, heads, head_dim)`` / ``(heads, head_dim, width)``
  and their ``(heads, head_dim)`` biases: ``heads``, ``kv``;
- a leading dimension every array under a module shares (``nn.scan``,
  ``nnx.vmap``): ``layers``;
- convolution kernels: spatial dimensions null, input channels ``embed``
  (null where they are the input's own channels, e.g. RGB), output channels
  ``mlp``; vectors of a convolution's output size (BatchNorm, biases): ``mlp``.

Anything else is left null and listed as ambiguous: a proposal, never applied
silently. Leaves that already carry names keep them. Leaves whose paths
differ only by a layer index (``Block_0``, ``layers/3``) share a row.

Example::

    >>> from partitioning.propose import propose_annotations
    >>> def array(*shape):
    ...     return jax.ShapeDtypeStruct(shape, jnp.float32)
    >>> params = {"wte": array(1000, 64), "ln": array(64),
    ...           "layers": [{"w_in": array(64, 256), "w_out": array(256, 64)} for _ in range(4)]}
    >>> proposal = propose_annotations({"params": params})
    >>> proposal.sizes
    {'embed': 64, 'vocab': 1000, 'mlp': 256}
    >>> for row in proposal.rows:
    ...     print(row.pattern, row.names, len(row.paths))
    ^params/layers/\\d+/w_in$ ('embed', 'mlp') 4
    ^params/layers/\\d+/w_out$ ('mlp', 'embed') 4
    ^params/ln$ ('embed',) 1
    ^params/wte$ ('vocab', 'embed') 1
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from collections.abc import Collection, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from partitioning.boxes import is_box
from partitioning.fmt import fmt_bytes, fmt_shape
from partitioning.paths import path_str

VECTOR_LEAVES = {"bias", "scale", "b", "g", "gamma", "beta", "mean", "var", "offset"}
EMBEDDING = re.compile(r"embed|wte|tok", re.IGNORECASE)
OUTPUT = re.compile(r"^(out|o|o_proj|out_proj|proj|c_proj|wo|dense_out)$", re.IGNORECASE)
ATTENTION = re.compile(r"attn|attention|query|key|value|^q|^k|^v|qkv", re.IGNORECASE)
SLOT = re.compile(r"^(\d+)$|^(.*_)(\d+)$")
MAX_KERNEL = 11  # spatial sizes of a convolution kernel are at most this
HEAVY = 0.05  # an unnamed array over this share of the state is warned about (replicated under every rule table)


@dataclasses.dataclass(frozen=True)
class Leaf:
    path: str
    shape: tuple[int, ...]
    nbytes: int = 0


@dataclasses.dataclass(frozen=True)
class Unnamed:
    """An array no rule of thumb names: replicated under every rule table, its bytes and share of the state."""

    path: str
    shape: tuple[int, ...]
    nbytes: int
    share: float

    def __str__(self) -> str:
        return f"{self.path} {fmt_shape(self.shape)}: {fmt_bytes(self.nbytes)}, {self.share:.1%} of the state"


@dataclasses.dataclass
class ProposedRow:
    """One proposed row: the regex, names per dimension, why each, and the arrays it covers."""

    pattern: str
    names: tuple[str | None, ...]
    reasons: tuple[str, ...]
    paths: list[str]
    shape: tuple[int, ...]

    @property
    def ambiguous(self) -> list[int]:
        return [i for i, (n, r) in enumerate(zip(self.names, self.reasons, strict=True)) if n is None and "?" in r]


@dataclasses.dataclass
class Proposal:
    """The proposed table, the sizes it was read from, and what it left alone."""

    rows: list[ProposedRow]
    sizes: dict[str, int]
    named: list[str]  # arrays that already carry names (kept)
    unnamed: list[Unnamed]  # arrays no rule of thumb names at all, largest first

    def heavy(self, share: float = HEAVY) -> list[Unnamed]:
        """The unnamed arrays over ``share`` of the state: replicated under every rule table, they cost most."""
        return [u for u in self.unnamed if u.share > share]

    @property
    def ambiguous(self) -> list[str]:
        return [
            f"{r.paths[0]} dim {i} ({r.shape[i]}){f' and {len(r.paths) - 1} more' if len(r.paths) > 1 else ''}"
            for r in self.rows
            for i in r.ambiguous
        ]


def _leaves(tree: Any) -> tuple[list[Leaf], list[str], int]:
    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: is_box(x) or isinstance(x, nnx.Variable))[0]
    out, named, total = [], [], 0
    for kp, leaf in flat:
        path = path_str(kp)
        names = None
        if isinstance(leaf, nnx.Variable):
            names = leaf.get_metadata().get("out_sharding")
            leaf = leaf.get_value()
        if is_box(leaf):
            names, leaf = leaf.names, leaf.value
        shape = tuple(int(s) for s in getattr(leaf, "shape", ()))
        if not shape:
            continue
        nbytes = math.prod(shape) * jnp.dtype(getattr(leaf, "dtype", jnp.float32)).itemsize
        total += nbytes
        if names is not None:
            named.append(path)
        else:
            out.append(Leaf(path, shape, nbytes))
    return out, named, total


def _stacked(leaves: Sequence[Leaf]) -> dict[str, int]:
    """Module prefixes whose arrays all share a leading dimension, with a vector among them stacked to 2-D."""
    by_prefix: dict[str, list[Leaf]] = collections.defaultdict(list)
    for leaf in leaves:
        parts = leaf.path.split("/")
        for k in range(1, len(parts)):
            by_prefix["/".join(parts[:k])].append(leaf)
    found: dict[str, int] = {}
    for prefix in sorted(by_prefix, key=len):
        items = by_prefix[prefix]
        if any(leaf.path.startswith(p + "/") for p in found for leaf in items):
            continue
        firsts = {leaf.shape[0] for leaf in items}
        if (
            len(items) >= 2
            and len(firsts) == 1
            and all(len(leaf.shape) >= 2 for leaf in items)
            and any(leaf.path.rsplit("/", 1)[-1] in VECTOR_LEAVES and len(leaf.shape) == 2 for leaf in items)
        ):
            found[prefix] = firsts.pop()
    return found


def _is_conv(leaf: Leaf, core: tuple[int, ...]) -> bool:
    if leaf.path.rsplit("/", 1)[-1] != "kernel" or len(core) < 3:
        return False
    if "conv" in leaf.path.lower():
        return True
    return len(core) == 4 and core[0] == core[1] <= MAX_KERNEL


def propose_annotations(tree: Any, *, input_channels: int | None = None, embeddings: Collection[str] = ()) -> Proposal:
    """A :class:`Proposal` for the unnamed leaves of ``tree`` (an abstract init, boxed or not).

    ``input_channels``: the last dimension of an image input, so a first
    convolution's input channels are left null rather than named ``embed``.
    ``embeddings``: the paths of the tables the model indexes with its integer inputs
    (:func:`~partitioning.model.embeddings.embedding_tables`): named ``(vocab, embed)`` whatever their width,
    and left out of the vote for the model's width (their rows are the vocabulary).
    """
    leaves, named, total = _leaves(tree)
    stacked = _stacked(leaves)

    def prefix_of(leaf: Leaf) -> str | None:
        return next((p for p in stacked if leaf.path.startswith(p + "/")), None)

    cores = {}
    for leaf in leaves:
        cores[leaf.path] = leaf.shape[1:] if prefix_of(leaf) is not None else leaf.shape
    tables = {leaf.path for leaf in leaves if leaf.path in embeddings and len(leaf.shape) == 2 and not prefix_of(leaf)}
    convs = {leaf.path for leaf in leaves if _is_conv(leaf, cores[leaf.path])}
    matrices = [cores[leaf.path] for leaf in leaves if leaf.path not in convs and len(cores[leaf.path]) >= 2]
    vectors = collections.Counter(c[0] for leaf in leaves if len(c := cores[leaf.path]) == 1)
    # Each weight votes for its sizes with its element count: the residual width is in the most weight.
    votes: collections.Counter[int] = collections.Counter()
    for leaf in leaves:
        core = cores[leaf.path]
        skip = leaf.path in convs or leaf.path in tables
        if not skip and len(core) >= 2 and leaf.path.rsplit("/", 1)[-1] not in VECTOR_LEAVES:
            for s in set(core):
                votes[s] += math.prod(core)
    conv_out = {cores[p][-1] for p in convs}
    sizes: dict[str, int] = {}
    if votes:
        # A CNN's head reads the last (widest) convolution's channels: that is its width.
        widest = max(conv_out, default=None)
        sizes["embed"] = max(votes, key=lambda s: (votes[s], s == widest, vectors[s], s))
    d = sizes.get("embed")
    for leaf in leaves:
        core, last = cores[leaf.path], leaf.path.split("/")[-2:]
        if leaf.path not in convs and len(core) == 2 and d in core and any(EMBEDDING.search(x) for x in last):
            other = [s for s in core if s != d]
            if other:
                sizes["vocab"] = max(other + [sizes.get("vocab", 0)])
    for path in tables:  # the rows of a table the integer inputs index: the vocabulary, by use
        sizes["vocab"] = max(cores[path][0], sizes.get("vocab", 0))
    wide = [s for core in matrices if d in core and len(core) == 2 for s in core if d is not None and s > d]
    wide = [s for s in wide if s != sizes.get("vocab")] or [s for s in wide if wide.count(s) > 2]
    if wide:
        sizes["mlp"] = max(wide)
    heads_kv: set[tuple[int, ...]] = {
        core[1:] if core[0] == d else core[:2] for core in matrices if len(core) == 3 and d in (core[0], core[2])
    }
    layers = sorted(set(stacked.values()))
    if layers:
        sizes["layers"] = layers[0]

    named_leaves: list[tuple[Leaf, tuple[str | None, ...], tuple[str, ...]]] = []
    unnamed = []
    for leaf in leaves:
        names, reasons = _name(leaf, cores[leaf.path], leaf.path in convs, sizes, heads_kv, conv_out, input_channels)
        if leaf.path in tables:
            width = leaf.shape[1]
            names = ("vocab", "embed")
            reasons = (
                f"vocab: {leaf.shape[0]} rows the integer inputs index (an embedding table, by use)",
                f"embed: the embedding's width {width}"
                + (f" (the model's is {d})" if d is not None and d != width else ""),
            )
        prefix = prefix_of(leaf)
        if prefix is not None:
            names = ("layers", *names)
            reasons = (f"layers: leading {leaf.shape[0]} shared by every array under {prefix}", *reasons)
        if all(n is None for n in names):
            unnamed.append(Unnamed(leaf.path, leaf.shape, leaf.nbytes, leaf.nbytes / max(total, 1)))
        named_leaves.append((leaf, names, reasons))
    rows = _group([x for x in named_leaves if any(n is not None for n in x[1])])
    return Proposal(rows, sizes, named, sorted(unnamed, key=lambda u: (-u.nbytes, u.path)))


def _name(
    leaf: Leaf,
    core: tuple[int, ...],
    conv: bool,
    sizes: dict[str, int],
    heads_kv: set[tuple[int, ...]],
    conv_out: set[int],
    input_channels: int | None,
) -> tuple[tuple[str | None, ...], tuple[str, ...]]:
    d, mlp, vocab = sizes.get("embed"), sizes.get("mlp"), sizes.get("vocab")
    names: list[str | None] = [None] * len(core)
    why = [f"? {s}: no rule of thumb names it" for s in core]
    module = leaf.path.split("/")[-2] if "/" in leaf.path else ""
    if conv:
        for i in range(len(core) - 2):
            why[i] = f"null: kernel spatial {core[i]}"
        cin, cout = core[-2], core[-1]
        if input_channels is not None and cin == input_channels:
            why[-2] = f"null: input channels {cin} are the input's own (not a model width)"
        else:
            names[-2], why[-2] = "embed", f"embed: conv input channels {cin}"
        names[-1], why[-1] = "mlp", f"mlp: conv output channels {cout}"
        return tuple(names), tuple(why)
    if len(core) == 3 and d is not None and d in (core[0], core[2]):
        at = (0, 1, 2) if core[0] == d else (2, 0, 1)
        for i, n in zip(at, ("embed", "heads", "kv"), strict=True):
            names[i] = n
        why[at[0]] = f"embed: residual width {d}"
        why[at[1]] = f"heads: {core[at[1]]} heads of a 3-D attention kernel"
        why[at[2]] = f"kv: head size {core[at[2]]}"
        return tuple(names), tuple(why)
    if len(core) == 2 and tuple(core) in heads_kv and d not in core:
        return ("heads", "kv"), (f"heads: {core[0]} heads (attention bias)", f"kv: head size {core[1]}")
    hint_vocab = EMBEDDING.search(leaf.path) or re.search(r"head|logit|vocab|unembed", leaf.path, re.IGNORECASE)
    for i, s in enumerate(core):
        if len(core) == 1 and s in conv_out:  # in a CNN a vector belongs to the convolution before it
            names[i], why[i] = "mlp", f"mlp: channels {s} of a convolution's output"
        elif s == d:
            names[i], why[i] = "embed", f"embed: residual width {d}"
        elif s == vocab and (s != mlp or hint_vocab):
            names[i], why[i] = "vocab", f"vocab: vocabulary size {s}"
        elif s == mlp:
            names[i], why[i] = "mlp", f"mlp: widest hidden width {s}"
    if len(core) == 2 and core[0] == core[1] == d:  # a square (width, width) projection
        side = 0 if OUTPUT.match(module) else 1
        names[side] = "heads" if ATTENTION.search(leaf.path) else None
        why[side] = (
            f"heads: the attention side ({core[side]}) of a square projection"
            if names[side]
            else f"? {core[side]}: the other side of a square ({d}, {d}) weight"
        )
    seen: set[str] = set()
    for i, given in enumerate(names):  # one dimension per name: a repeat is ambiguous
        if given is not None and given in seen:
            names[i], why[i] = None, f"? {core[i]}: {given} already names dim {names.index(given)}"
        elif given is not None:
            seen.add(given)
    return tuple(names), tuple(why)


def _template(path: str) -> tuple[list[tuple[str, str | None]], tuple[int, ...]]:
    parts: list[tuple[str, str | None]] = []
    values: list[int] = []
    for c in path.split("/"):
        m = SLOT.match(c)
        if m is None:
            parts.append((re.escape(c), None))
        elif m.group(1) is not None:
            parts.append(("", "slot"))
            values.append(int(m.group(1)))
        else:
            parts.append((re.escape(m.group(2)), "slot"))
            values.append(int(m.group(3)))
    return parts, tuple(values)


def _pattern(parts: list[tuple[str, str | None]], key: tuple[Any, ...]) -> str:
    out, j = [], 0
    for text, slot in parts:
        if slot is None:
            out.append(text)
        else:
            out.append(text + (r"\d+" if key[j] == "*" else str(key[j])))
            j += 1
    return "^" + "/".join(out) + "$"


def _group(items: list[tuple[Leaf, tuple[str | None, ...], tuple[str, ...]]]) -> list[ProposedRow]:
    """One row per set of leaves whose paths differ only by indices that do not change their names."""
    by_skeleton: dict[str, list[tuple[Leaf, tuple[int, ...], tuple[str | None, ...], tuple[str, ...]]]] = {}
    templates: dict[str, list[tuple[str, str | None]]] = {}
    for leaf, names, reasons in items:
        parts, values = _template(leaf.path)
        skeleton = "/".join(t + ("#" if s else "") for t, s in parts)
        templates[skeleton] = parts
        by_skeleton.setdefault(skeleton, []).append((leaf, values, names, reasons))
    rows: list[tuple[int, ProposedRow]] = []
    order = {leaf.path: i for i, (leaf, _, _) in enumerate(items)}
    for skeleton, group in by_skeleton.items():
        k = len(group[0][1])
        general = [False] * k

        def keyed(gen: list[bool], group: Any = group) -> dict[tuple[Any, ...], list[Any]]:
            out: dict[tuple[Any, ...], list[Any]] = {}
            for x in group:
                out.setdefault(tuple("*" if g else v for g, v in zip(gen, x[1], strict=True)), []).append(x)
            return out

        for j in range(k):
            trial = general[:j] + [True] + general[j + 1 :]
            merged = keyed(trial)
            if len(merged) < len(keyed(general)) and all(len({x[2] for x in m}) == 1 for m in merged.values()):
                general = trial
        for key, members in keyed(general).items():
            first = members[0]
            rows.append(
                (
                    order[first[0].path],
                    ProposedRow(
                        _pattern(templates[skeleton], key),
                        first[2],
                        first[3],
                        [m[0].path for m in members],
                        first[0].shape,
                    ),
                )
            )
    return [r for _, r in sorted(rows, key=lambda x: x[0])]


__all__ = ["Proposal", "ProposedRow", "Unnamed", "propose_annotations", "HEAVY"]
