"""pt.show_sharding: which mesh axes split which dimension, and a labelled grid of the blocks."""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import partitioning as pt


def test_show_sharding_labels_rows_columns_and_devices(capsys):
    mesh = pt.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    x = jax.device_put(jnp.zeros((64, 256)), NamedSharding(mesh, P("fsdp", "tensor")))
    pt.show_sharding(pt.LogicallyPartitioned(x, ("embed", "mlp")))
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == [
        "(64, 256) float32 P('fsdp', 'tensor') on mesh {data: 1, fsdp: 4, tensor: 2}",
        "  rows: dim 0 (embed, 64) split 4 ways over fsdp: 16 per device",
        "  columns: dim 1 (mlp, 256) split 2 ways over tensor: 128 per device",
    ]
    grid = "\n".join(out[3:])
    assert "mlp [0:128]" in grid and "mlp [128:256]" in grid
    row = next(line for line in out if "embed [16:32]" in line)
    assert row.split("│")[2:4] == ["    CPU 2    ", "     CPU 3     "]
    # Replicated blocks list every device holding them; more than 2 dimensions: the lines only.
    y = jax.device_put(jnp.zeros((4, 64, 16)), NamedSharding(mesh, P(None, "fsdp")))
    pt.show_sharding(y)
    assert capsys.readouterr().out.splitlines()[1:] == [
        "  dim 0 (4) not split: 4 per device",
        "  dim 1 (64) split 4 ways over fsdp: 16 per device",
        "  dim 2 (16) not split: 16 per device",
    ]
    z = jax.device_put(jnp.zeros((16,)), NamedSharding(mesh, P("tensor")))
    pt.show_sharding(z)
    assert "CPU 0,2,4,6" in capsys.readouterr().out
