"""A griffe extension: the package's docstrings, written in reST for doctest and ``help()``, rendered as Markdown.

The docstrings stay as they are (``pytest --doctest-modules`` reads them); only the copy mkdocstrings renders
is rewritten, at build time:

- ``Example::`` and its indented block: ``Example:`` and a fenced block (``pycon`` for a doctest, ``yaml``,
  ``console`` or ``python`` where the block reads as one, plain text otherwise); a bare ``::`` disappears, as
  in reST;
- ``:class:`Rules``` (``:func:``, ``:meth:``, ``:attr:``, ``:mod:``, ``:data:``, ``:exc:``, ``:obj:``): a
  cross-reference to the API reference's entry where the name is documented there, a code span otherwise;
- a ``double-backtick`` literal: a Markdown code span.

``mkdocs.yml`` names this file under the python handler's ``extensions:``.
"""

from __future__ import annotations

import ast
import re
import textwrap
from typing import Any

import griffe

# A paragraph ending in "::" opens a literal block (reST): "Example::", "In YAML::", or a lone "::".
_LITERAL = re.compile(r"^(?P<indent>\s*)(?P<text>.*?)(?P<space>\s?)::\s*$")
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj):`(?P<target>[^`]+)`")
_DOUBLE = re.compile(r"``(?P<code>[^`]+?)``")


def _language(intro: str, block: list[str]) -> str:
    first = next(line.strip() for line in block if line.strip())
    if first.startswith(">>>"):
        return "pycon"
    if first.startswith("$ "):
        return "console"
    if "yaml" in intro.lower():
        return "yaml"
    try:
        ast.parse(textwrap.dedent("\n".join(block)))
    except SyntaxError:
        return "text"
    return "python"


def literal_blocks(text: str) -> str:
    """Every reST literal block (a paragraph ending in ``::`` and the indented lines after it) as a fence."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        match = _LITERAL.match(line)
        if not match or line.lstrip().startswith(">>>"):
            out.append(line)
            i += 1
            continue
        indent = len(match["indent"])
        j = i + 1
        block: list[str] = []
        while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > indent):
            block.append(lines[j])
            j += 1
        while block and not block[-1].strip():
            block.pop()
        while block and not block[0].strip():
            block.pop(0)
        if not any(b.strip() for b in block):  # "::" with nothing indented after it: not a literal block
            out.append(line)
            i += 1
            continue
        # "Example::" reads "Example:"; "text ::" reads "text"; a lone "::" is dropped (reST's rules).
        intro = match["text"] if match["space"] or not match["text"] else match["text"] + ":"
        if intro:
            out += [match["indent"] + intro, ""]
        inner = min(len(b) - len(b.lstrip()) for b in block if b.strip())
        fence = match["indent"] + "```"
        out.append(fence + _language(intro, block))
        out += [match["indent"] + b[inner:].rstrip() if b.strip() else "" for b in block]
        out += [fence, ""]
        i = j
    return "\n".join(out)


class _Links:
    """Which role targets have an entry in the API reference (``partitioning.NAME`` and its members)."""

    def __init__(self, pkg: griffe.Module) -> None:
        self.pkg = pkg
        self.public: dict[str, str] = {}  # canonical path -> the id of its entry
        for name in pkg.exports or []:
            name = str(name)
            try:
                target = pkg[name].final_target if pkg[name].is_alias else pkg[name]
            except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
                continue
            self.public.setdefault(target.canonical_path, f"{pkg.path}.{name}")

    def _find(self, path: str) -> Any:
        root, _, rest = path.partition(".")
        if root != self.pkg.path:
            return None
        try:
            obj = self.pkg[rest] if rest else self.pkg
            return obj.final_target if obj.is_alias else obj
        except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            return None

    def identifier(self, target: str, where: Any) -> str | None:
        """The API reference's id for ``target`` as written in ``where``'s docstring, or None."""
        scopes = []
        scope = where
        while scope is not None:
            scopes.append(f"{scope.path}.{target}")
            scope = scope.parent
        candidates = [target] if target.startswith(f"{self.pkg.path}.") else [*scopes, f"{self.pkg.path}.{target}"]
        for path in candidates:
            obj = self._find(path)
            if obj is None:
                continue
            if obj.canonical_path in self.public:
                return self.public[obj.canonical_path]
            parent = obj.parent
            # A documented member of a documented class (mkdocstrings renders members with a docstring).
            if (
                parent is not None
                and parent.canonical_path in self.public
                and not obj.name.startswith("_")
                and obj.has_docstring
            ):
                return f"{self.public[parent.canonical_path]}.{obj.name}"
        return None


def markdown(text: str, where: Any, links: _Links) -> str:
    """One docstring's reST as Markdown (literal blocks fenced, roles linked, ``x`` as `x`)."""
    text = literal_blocks(text)
    out: list[str] = []
    in_fence = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        if not in_fence:

            def role(m: re.Match[str]) -> str:
                target = m["target"].strip().lstrip("!")
                short = target.startswith("~")
                target = target.lstrip("~").lstrip(".").removesuffix("()")
                shown = target.rsplit(".", 1)[-1] if short else target
                ident = links.identifier(target, where)
                return f"[`{shown}`][{ident}]" if ident else f"`{shown}`"

            line = _DOUBLE.sub(lambda m: f"`{m['code']}`", _ROLE.sub(role, line))
        out.append(line)
    return "\n".join(out)


class RestDocstrings(griffe.Extension):
    """Rewrites every docstring of the loaded package once its tree is complete (aliases resolvable)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        links = _Links(pkg)
        seen: set[str] = set()

        def walk(obj: Any) -> None:
            if obj.is_alias or obj.path in seen:
                return
            seen.add(obj.path)
            if obj.docstring is not None:
                obj.docstring.value = markdown(obj.docstring.value, obj, links)
            for member in obj.members.values():
                walk(member)

        walk(pkg)
