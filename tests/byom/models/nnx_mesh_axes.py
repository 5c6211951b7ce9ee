"""An NNX model annotated with mesh-axis names, as in Flax's NNX sharding guide (written for these tests).

Parameters name the device mesh axes directly (``("fsdp", "tensor")``) and
activations are constrained with ``jax.lax.with_sharding_constraint`` on mesh
axes; no logical names anywhere.
"""

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P


class DotReluDot(nnx.Module):
    def __init__(self, depth: int, rngs: nnx.Rngs):
        init = nnx.initializers.lecun_normal()
        self.dot1 = nnx.Linear(
            depth, depth, kernel_init=nnx.with_partitioning(init, ("fsdp", "tensor")), use_bias=False, rngs=rngs
        )
        self.w2 = nnx.Param(init(rngs.params(), (depth, depth)), sharding=("tensor", None))
        self.bias = nnx.Param(jnp.zeros((depth,)), out_sharding=("tensor",))

    def __call__(self, x):
        y = jax.nn.relu(self.dot1(x) + self.bias[...])
        y = jax.lax.with_sharding_constraint(y, P("fsdp", "tensor"))
        return jnp.dot(y, self.w2[...])


class ToyMLP(nnx.Module):
    """Flax's ``examples/nnx_toy_examples/10_fsdp_and_optimizer.py`` MLP: mesh-axis names via a rules dataclass."""

    def __init__(self, din: int, dmid: int, dout: int, rngs: nnx.Rngs):
        init = nnx.initializers.lecun_normal()
        self.w1 = nnx.Param(init(rngs.params(), (din, dmid)), out_sharding=(None, "model"))
        self.b1 = nnx.Param(jnp.zeros((dmid,)), out_sharding=("model",))
        self.w2 = nnx.Param(init(rngs.params(), (dmid, dout)), out_sharding=(None, "model"))

    def __call__(self, x):
        return nnx.relu(x @ self.w1 + self.b1) @ self.w2
