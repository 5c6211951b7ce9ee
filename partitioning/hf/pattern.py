"""Name-map patterns: how a file tensor's dimensions are a parameter's, in einops notation.

``"(h k) d -> d h k"`` says the file stores a ``(h*k, d)`` tensor whose first
dimension is the row-major pair ``(h, k)`` and the parameter is ``(d, h, k)``.
An integer in a group is a dimension only the file has (``"d (3 h k) -> d h k"``:
GPT-2's fused q/k/v, the parameter being part 0, 1 or 2). Since a row-major
tensor of shape ``(h*k, d)`` *is* one of shape ``(h, k, d)``, every pattern is
a pure view (the file's *atoms*, one dimension per name or integer) followed by
a transpose: a box of the parameter is a box of the atoms, which is how
:mod:`~partitioning.hf.read` reads only what a device holds.

Example::

    >>> from partitioning.hf.pattern import Pattern
    >>> p = Pattern.parse("(h k) d -> d h k")
    >>> p.file_shape((32, 4, 8)), p.atom_box(((0, 16), (0, 2), (0, 8)))
    ((32, 32), ((0, 2), (0, 8), (0, 16)))
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

import numpy as np

Box = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Pattern:
    """A parsed ``"<file axes> -> <param axes>"`` pattern (see the module docstring)."""

    groups: tuple[tuple[str | int, ...], ...]
    dst: tuple[str, ...]

    @staticmethod
    @functools.cache
    def parse(text: str) -> Pattern:
        lhs, arrow, rhs = text.partition("->")
        if not arrow:
            raise ValueError(f"pattern {text!r} has no '->'")
        groups = []
        for m in re.finditer(r"\(([^)]*)\)|(\S+)", lhs):
            atoms = (m.group(1) if m.group(1) is not None else m.group(2)).split()
            groups.append(tuple(int(a) if a.isdigit() else a for a in atoms))
        dst = tuple(rhs.split())
        names = [a for g in groups for a in g if isinstance(a, str)]
        if sorted(names) != sorted(dst) or len(set(dst)) != len(dst):
            raise ValueError(f"pattern {text!r}: the file's named axes must be the parameter's, each once")
        if sum(isinstance(a, int) for g in groups for a in g) > 1:
            raise ValueError(f"pattern {text!r}: at most one part axis")
        return Pattern(tuple(groups), dst)

    @property
    def atoms(self) -> tuple[str | int, ...]:
        return tuple(a for g in self.groups for a in g)

    @property
    def part_axis(self) -> int | None:
        """The atom position of the integer (part) axis, if any."""
        return next((i for i, a in enumerate(self.atoms) if isinstance(a, int)), None)

    @property
    def parts(self) -> int:
        i = self.part_axis
        return 1 if i is None else int(self.atoms[i])

    def atom_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The file tensor viewed with one dimension per atom, for a parameter of ``shape``."""
        size = dict(zip(self.dst, shape, strict=True))
        return tuple(a if isinstance(a, int) else size[a] for a in self.atoms)

    def file_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The file tensor's shape for a parameter of ``shape``."""
        sizes = iter(self.atom_shape(shape))
        return tuple(math.prod(next(sizes) for _ in g) for g in self.groups)

    def atom_box(self, box: Box, part: int | None = None) -> Box:
        """The atoms' box holding the parameter's ``box`` (``part`` for the part axis)."""
        by_name = dict(zip(self.dst, box, strict=True))
        p = 0 if part is None else part
        return tuple((p, p + 1) if isinstance(a, int) else by_name[a] for a in self.atoms)

    def atoms_view(self, param: np.ndarray) -> np.ndarray:
        """A view of a (part of a) parameter-ordered array in atom order (the part axis of size 1)."""
        named = [a for a in self.atoms if isinstance(a, str)]
        view = param.transpose([self.dst.index(a) for a in named])
        i = self.part_axis
        return view if i is None else np.expand_dims(view, i)

    def to_file(self, parts: list[np.ndarray]) -> np.ndarray:
        """The file tensor from the parameter arrays of each part (one array without a part axis)."""
        views = [self.atoms_view(p) for p in parts]
        atoms = views[0] if self.part_axis is None else np.concatenate(views, axis=self.part_axis)
        sizes = iter(atoms.shape)
        return np.ascontiguousarray(atoms).reshape([math.prod(next(sizes) for _ in g) for g in self.groups])


__all__ = ["Pattern", "Box"]
