"""Reference models annotated with logical axis names.

Importing this package registers ``mlp`` and ``gpt`` with the model registry.
"""

from models.mlp import MLP
from models.gpt import GPT

__all__ = ["MLP", "GPT"]
