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
