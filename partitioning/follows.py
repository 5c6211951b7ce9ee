"""Names that follow other names: an activation's ``activation_embed`` is laid out as ``embed``.

Codebases name activations apart from parameters — MaxText constrains with
``activation_batch``, ``activation_length``, ``activation_embed``,
``activation_mlp``, ``activation_heads``, … — and a rule table written for
parameter names (``embed``, ``mlp``, ``heads``) matches none of them: those
activations would be left unsharded (all-gathered over ``fsdp`` every
layer). A rule table's ``follows`` maps such a name to the logical name it is
laid out as; the rule walk then sees the followed name, so a MaxText block
under a preset resolves exactly like the same block written with the
toolkit's own names. The walk itself is unchanged (Flax's): following is a
renaming before it.

:data:`ACTIVATIONS` is the shipped set (MaxText's activation names, and
``activation_<name>`` for the toolkit's own logical names); every preset
declares ``follows: activations``. In YAML::

    rules:
      - [batch, [data, fsdp]]
      - [embed, fsdp]
    follows: activations             # or a mapping: {my_hidden: embed}

Example::

    >>> from partitioning.follows import ACTIVATIONS, canonical
    >>> canonical(("activation_batch", "activation_length", "activation_embed"), ACTIVATIONS)
    ('batch', 'length', 'embed')
    >>> pt.Rules.preset("fsdp").resolve(("activation_batch", "activation_length", "activation_embed"))
    P(('data', 'fsdp'), None, None)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from partitioning.errors import RuleError

# The toolkit's logical names (and MaxText's weight names that differ): `activation_<name>` follows `<name>`.
_PLAIN = ("batch", "length", "embed", "mlp", "heads", "kv_heads", "kv", "vocab", "expert", "layers")
ACTIVATIONS: dict[str, str] = {f"activation_{n}": n for n in _PLAIN} | {
    # MaxText (src/maxtext/configs/base.yml, common_types.py): batch ...
    "activation_embed_and_logits_batch": "batch",
    "activation_embed_and_logits_batch_sequence": "batch",
    "activation_batch_attn": "batch",
    "activation_batch_moe": "batch",
    "activation_kv_batch": "batch",
    "activation_prefill_kv_batch": "batch",
    # ... length (the keys' and values' length stays whole: activation_kv_length follows nothing)
    "activation_norm_length": "length",
    "activation_norm_length_moe": "length",
    "activation_length_attn": "length",
    "activation_length_moe": "length",
    "activation_input_length_attn": "length",
    "activation_q_length": "length",
    # ... embed, heads, head dim, mlp, experts
    "activation_embed_attn": "embed",
    "activation_embed_moe": "embed",
    "activation_kv_head_dim": "kv",
    "activation_mlp_moe": "mlp",
    "activation_exp": "expert",
}
NAMED = {"activations": ACTIVATIONS}


def parse_follows(value: Any, where: str) -> dict[str, str]:
    """``follows:`` from YAML or Python: a named set (``activations``), a mapping, or a list of both."""
    if value is None:
        return {}
    if isinstance(value, str):
        if value not in NAMED:
            raise RuleError(f"{where}: unknown follows set {value!r} (known: {', '.join(NAMED)})")
        return dict(NAMED[value])
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str) or not isinstance(v, str) or not k or not v:
                raise RuleError(f"{where}: follows maps a name to the name it is laid out as, got {k!r}: {v!r}")
            out[k] = v
        return out
    if isinstance(value, (list, tuple)):
        out = {}
        for v in value:
            out.update(parse_follows(v, where))
        return out
    raise RuleError(f"{where}: follows must be a set name ({', '.join(NAMED)}) or a mapping, got {value!r}")


def canonical(names: Sequence[Any], follows: Mapping[str, str]) -> tuple[Any, ...]:
    """``names`` with every followed name replaced by the name it follows (others unchanged).

    A name that is also a dimension's own name stays itself: ``('embed', 'activation_embed')`` keeps both.
    """
    names = tuple(names)
    if not follows:
        return names
    own = {n for n in names if isinstance(n, str)}
    return tuple(follows[n] if isinstance(n, str) and n in follows and follows[n] not in own else n for n in names)


__all__ = ["ACTIVATIONS", "NAMED", "parse_follows", "canonical"]
