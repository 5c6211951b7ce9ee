"""Decoding: generation with a KV cache, on a mesh under a rule table, greedy or sampled.

Modules:

- :mod:`~partitioning.decode.cache` — the KV cache of decode mode: keys and values in a ``cache`` collection,
  named with logical axes so the rules lay it out like the activations.
- :mod:`~partitioning.decode.generate` — decoding with a KV cache (``generate``), on a mesh under rules; batches.
- :mod:`~partitioning.decode.sampling` — next-token choice as transformers does it: temperature, top-k, top-p.

Imports: the core modules, :mod:`partitioning.parallel` (a pipeline's stages) and :mod:`partitioning.data`
(batches placed on the mesh).

Example::

    >>> from partitioning.decode import Sampling
    >>> Sampling(temperature=0.7, top_k=50).greedy
    False
"""

from partitioning.decode.generate import generate
from partitioning.decode.sampling import Sampling

__all__ = ["generate", "Sampling"]
