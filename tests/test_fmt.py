"""How values are written for people (partitioning.fmt)."""

from jax.sharding import PartitionSpec as P

from partitioning.fmt import fmt_axes, fmt_bytes, fmt_mesh, fmt_rules, fmt_shape, fmt_spec


def test_bytes():
    assert [fmt_bytes(n) for n in (0, 1023, 1024, 1536 * 1024, 3 * 2**30, 2**40, 2**52)] == [
        "0 B",
        "1023 B",
        "1.00 KiB",
        "1.50 MiB",
        "3.00 GiB",
        "1.00 TiB",
        "4.00 PiB",
    ]


def test_specs_shapes_meshes_rules():
    assert fmt_spec(P("fsdp", None)) == "P('fsdp', None)"
    assert fmt_spec((("data", "fsdp"), None)) == "P(('data', 'fsdp'), None)"
    assert fmt_spec(None) == "-"
    assert fmt_shape((64,)) == "(64,)" and fmt_shape((80, 8192)) == "(80, 8192)"
    assert fmt_mesh({"data": 2, "fsdp": 4}) == "{data: 2, fsdp: 4}" == fmt_mesh([("data", 2), ("fsdp", 4)])
    assert [fmt_axes(a) for a in (None, "fsdp", ("data", "fsdp"))] == ["null", "fsdp", "data/fsdp"]
    assert fmt_rules([["batch", ["data", "fsdp"]], ["mlp", None]]) == "[batch, [data, fsdp]], [mlp, null]"
    assert fmt_rules([]) == "(none)"
