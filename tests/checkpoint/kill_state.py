"""The state the SIGKILL test's child process saves, shared by the child and the test (a plain module,
importable in the child, which has no pytest fixtures). Step k's state is ``base_values() + k``."""

import numpy as np

SHAPES = {"a": (4096, 4096), "b": (2048, 4096), "c": (1024, 4096)}  # 112 MiB of float32
SHAPES.update({f"small_{i}": (64, 256) for i in range(16)})  # many small arrays too


def base_values():
    rng = np.random.default_rng(0)
    return {n: rng.standard_normal(s, dtype=np.float32) for n, s in SHAPES.items()}
