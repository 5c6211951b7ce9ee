"""A small convolutional classifier with BatchNorm (written for these tests), and the image set it learns.

BatchNorm keeps running statistics in the mutable ``batch_stats`` collection;
``train`` is a call argument, as in Flax's ImageNet / MNIST examples. The
images are generated: each class is a bright bar at its own angle, on noise.
"""

import flax.linen as nn
import numpy as np

from partitioning.data.corpus import ArrayDataset


class ConvNet(nn.Module):
    classes: int = 8
    channels: int = 32
    axis_name: str | None = None  # pmap-era cross-replica BatchNorm, as Flax's ImageNet ResNet has

    @nn.compact
    def __call__(self, x, train: bool = False):
        for i in range(2):
            x = nn.Conv(
                self.channels * (i + 1),
                (3, 3),
                use_bias=False,
                kernel_init=nn.with_logical_partitioning(
                    nn.initializers.lecun_normal(), (None, None, "embed", "mlp") if i else (None, None, None, "mlp")
                ),
            )(x)
            x = nn.BatchNorm(
                use_running_average=not train,
                momentum=0.9,
                axis_name=self.axis_name,
                scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("mlp",)),
                bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)),
            )(x)
            x = nn.max_pool(nn.relu(x), (2, 2), (2, 2))
        x = x.mean(axis=(1, 2))
        return nn.Dense(
            self.classes, kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("mlp", "vocab"))
        )(x)


def bars(n: int = 512, size: int = 16, classes: int = 8, seed: int = 0) -> ArrayDataset:
    """``n`` noisy images ``(size, size, 1)`` of a bar at one of ``classes`` angles, and the angle's class."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    ys, xs = np.mgrid[:size, :size] - (size - 1) / 2
    angles = labels * np.pi / classes
    dist = np.abs(xs[None] * np.sin(angles)[:, None, None] - ys[None] * np.cos(angles)[:, None, None])
    images = (dist < 1.2).astype(np.float32) + 0.3 * rng.standard_normal((n, size, size)).astype(np.float32)
    return ArrayDataset(
        {"inputs": images[..., None], "targets": labels.astype(np.int32)}, eval_fraction=0.125, source="bars"
    )
