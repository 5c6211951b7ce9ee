"""MkDocs hooks: the pages generated from the code at build time, so they can never drift from it.

- ``reference/config.md``: every key of a run config, from the pydantic schema (``partitioning config schema``);
- ``reference/api.md``: the API reference of the core, one mkdocstrings entry per name of
  ``partitioning.__all__``, grouped as ``partitioning/__init__.py`` groups them; and
  ``reference/api/<namespace>.md``, a page per namespace (``pt.hf``, ``pt.data``, ...: :data:`NAMESPACES`),
  one entry per name of its ``__all__``;
- ``changelog.md``: the repository's ``CHANGELOG.md``;
- the nav: a guide added to ``docs/`` but not yet to ``mkdocs.yml``'s nav joins the Guides section (titled by
  its first heading), so a new page is never silently left out;
- ``notebooks/*.ipynb``: the executed notebooks of the repository's ``notebooks/`` folder, added to the site
  as they are (mkdocs-jupyter renders them; nothing is re-executed).

``mkdocs.yml`` names this file under ``hooks:``.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parent.parent


# -- the config reference -------------------------------------------------------------------------


def _type(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    if "$ref" in prop:
        return defs[prop["$ref"].split("/")[-1]].get("title", "mapping")
    if "enum" in prop:
        return " | ".join(f"`{v}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{prop['const']}`"
    if "anyOf" in prop:
        return " or ".join(_type(p, defs) for p in prop["anyOf"])
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list of {_type(prop.get('items', {}), defs)}"
    if kind == "object":
        values = prop.get("additionalProperties")
        return f"mapping of {_type(values, defs)}" if isinstance(values, dict) else "mapping"
    return {"integer": "int", "number": "float", "string": "string", "boolean": "bool", "null": "null"}.get(kind, kind)


def _range(prop: dict[str, Any]) -> str:
    bounds = []
    for key, op in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<")):
        for p in [prop, *prop.get("anyOf", [])]:
            if key in p:
                bounds.append(f"{op} {p[key]}")
    return ", ".join(bounds)


def _default(prop: dict[str, Any], required: bool) -> str:
    if required:
        return "**required**"
    if "default" not in prop:
        return ""
    return f"`{json.dumps(prop['default'])}`"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|")


_CODE = re.compile(r"(`[^`]*`)")
_SPECIAL = re.compile(r"([\\*_{}\[\]])")


def _braces(text: str) -> str:
    """Each balanced ``{...}`` (a YAML mapping in a description) as a code span; the rest escaped."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "{":
            if depth == 0:
                out.append(_SPECIAL.sub(r"\\\1", text[start:i]).replace("<", "&lt;"))
                start = i
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0:
                out.append(f"`{text[start : i + 1]}`")
                start = i + 1
    out.append(_SPECIAL.sub(r"\\\1", text[start:]).replace("<", "&lt;"))
    return "".join(out)


def _literal(text: str) -> str:
    """A schema description as Markdown that renders it literally.

    Descriptions are plain text with `code` spans: outside those, ``{hf: dir, ...}`` would be read as an
    attribute list (attr_list), ``_target_`` as emphasis and ``[a][b]`` as a link.
    """
    parts = _CODE.split(text.replace("``", "`"))
    return _cell("".join(part if part.startswith("`") else _braces(part) for part in parts))


def config_reference() -> str:
    """Markdown: one table per section of the run config, from its JSON Schema (defaults from the models)."""
    from partitioning.config.schema import SECTIONS, json_schema

    schema = json_schema()
    # default_factory defaults are not in the JSON Schema: read them off a section built with no keys.
    defaults = {key: cls().model_dump(by_alias=True) for key, cls in SECTIONS.items()}
    excluded = {key: {n for n, f in cls.model_fields.items() if f.exclude} for key, cls in SECTIONS.items()}
    defs = schema.get("$defs", {})
    out = [
        "# Config reference",
        "",
        "Every key of a run config, generated from the schema the loader validates with "
        "(`partitioning config schema` prints it as JSON Schema, for editors). Unknown keys are errors, "
        "types are strict, and every number has the range shown. See [Run configs](../config.md) for how "
        "configs are read, overridden (`--set`) and extended (`base:`).",
        "",
        "## Top level",
        "",
        "| key | type | default | range | what |",
        "|---|---|---|---|---|",
    ]
    required = set(schema.get("required", []))
    sections = []
    for key, prop in schema["properties"].items():
        if "$ref" in prop:
            sections.append((key, defs[prop["$ref"].split("/")[-1]]))
            what = f"see [`{key}:`](#{key})"
        else:
            what = prop.get("description", "")
        out.append(
            f"| `{key}` | {_cell(_type(prop, defs))} | {_default(prop, key in required)} | {_range(prop)} | "
            f"{_literal(what) if '$ref' not in prop else what} |"
        )
    for key, section in sections:
        out += [
            "",
            f"## `{key}:` {{#{key}}}",
            "",
            _literal(section.get("description", "").replace("``", "`").removeprefix(f"`{key}:`: ")),
            "",
            "| key | type | default | range | what |",
            "|---|---|---|---|---|",
        ]
        req = set(section.get("required", []))
        for name, prop in section["properties"].items():
            if name in excluded[key]:
                continue
            if "default" not in prop and name in defaults[key]:
                prop = {**prop, "default": defaults[key][name]}
            out.append(
                f"| `{name}` | {_cell(_type(prop, defs))} | {_cell(_default(prop, name in req))} | {_range(prop)} | "
                f"{_literal(prop.get('description', ''))} |"
            )
        if key == "data":
            out += ["", "Or `data: {_target_: module.fn, ...}`: a dataset object (see [Data](../data.md))."]
        if key == "mesh":  # the model's keys, after the mesh's (the order of a run config)
            out += _model_section()
    return "\n".join(out) + "\n"


MODEL_HEADS = [
    (
        "name",
        "string",
        "a registered model (`mlp`, `gpt`, `moe`, ...: `partitioning.model.model_names()`); its "
        "constructor's options are keys beside it (`embed`, `heads`, `layers`, `remat`, ...)",
    ),
    (
        "_target_",
        "string",
        "`module.Class` (Hydra's convention): your own Linen or NNX model, built with the keys "
        "beside it as keyword arguments (recursively)",
    ),
    ("hf", "string", "a Hugging Face checkpoint folder (config.json, safetensors) or a config.json: the keys below"),
    (
        "lora",
        "mapping",
        "LoRA adapters on any of the three: {rank, alpha (default: rank), targets: [regex over "
        "parameter paths, ...], dropout, rslora, dtype (default: float32)} (see [Fine-tuning](../finetune.md))",
    ),
]


def _model_section() -> list[str]:
    """``model:``: one of name / _target_ / hf, then the keys of ``model: {hf: ...}`` from their schema."""
    from partitioning.config.schema import HfModelConfig

    hf = HfModelConfig.model_json_schema()
    defs = hf.get("$defs", {})
    out = [
        "",
        "## `model:` {#model}",
        "",
        "One of `name:`, `_target_:` or `hf:` says which model; the other keys are its options. "
        "[Run configs](../config.md) and [Pretrained models](../pretrained.md) show each form.",
        "",
        "| key | type | default | range | what |",
        "|---|---|---|---|---|",
    ]
    out += [f"| `{k}` | {t} | | | {_literal(what)} |" for k, t, what in MODEL_HEADS]
    out += ["", "With `hf:`, these keys (a checkpoint's options, checked against its config.json):", ""]
    out += ["| key | type | default | range | what |", "|---|---|---|---|---|"]
    required = set(hf.get("required", []))
    for name, prop in hf["properties"].items():
        if name in ("hf", "lora"):
            continue
        out.append(
            f"| `{name}` | {_cell(_type(prop, defs))} | {_cell(_default(prop, name in required))} | {_range(prop)} | "
            f"{_literal(prop.get('description', ''))} |"
        )
    return out


# -- the API reference ----------------------------------------------------------------------------


def _api_groups() -> list[tuple[str, list[str]]]:
    """``partitioning.__all__`` in its groups: the ``# comment`` above each run of names."""
    source = (REPO / "partitioning" / "__init__.py").read_text()
    tree = ast.parse(source)
    [node] = [n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "__all__"]
    lines = source.splitlines()[node.lineno - 1 : node.end_lineno]
    groups: list[tuple[str, list[str]]] = []
    for line in lines:
        line = line.strip()
        if line.startswith("#"):
            groups.append((line.lstrip("# ").strip(), []))
        elif line.startswith('"'):
            if not groups:
                groups.append(("", []))
            groups[-1][1].extend(n.strip().strip('"') for n in line.rstrip(",").split(",") if n.strip())
    return groups


def api_reference() -> str:
    """Markdown with one mkdocstrings entry per public name."""
    import partitioning

    out = [
        "# API reference",
        "",
        "The core vocabulary `import partitioning as pt` exports (`partitioning.__all__`), generated from the "
        "docstrings; the rest is in namespaces, a page each: "
        + ", ".join(f"[`pt.{n}`](api/{n}.md)" for n, _ in NAMESPACES)
        + ". Each example runs as a doctest and assumes only "
        "`import flax.linen as nn, jax, jax.numpy as jnp, numpy as np, partitioning as pt` and "
        "`pt.simulate_devices(8)`.",
    ]
    listed = set()
    for title, names in _api_groups():
        out += ["", f"## {title[:1].upper() + title[1:]}", ""]
        for name in names:
            listed.add(name)
            out += [f"::: partitioning.{name}", "    options:", "      heading_level: 3", ""]
    missing = set(partitioning.__all__) - listed
    if missing:
        raise RuntimeError(f"names of partitioning.__all__ missing from the API reference: {sorted(missing)}")
    return "\n".join(out) + "\n"


# The namespaces of ``import partitioning as pt``, each with its page: (module, title).
NAMESPACES = (
    ("model", "pt.model: any model behind one interface, and its task"),
    ("data", "pt.data: tokens, tokenizers, chat rows, batches"),
    ("finetune", "pt.finetune: trainable subsets, LoRA, merging"),
    ("decode", "pt.decode: generation"),
    ("parallel", "pt.parallel: pipeline stages and experts"),
    ("plan", "pt.plan: memory, collectives and FLOPs before running"),
    ("train", "pt.train: the step, the loop and its hooks"),
    ("checkpoint", "pt.checkpoint: orbax checkpoints"),
    ("hf", "pt.hf: Hugging Face checkpoints and PEFT adapters"),
    ("tune", "pt.tune: the best layout for a budget"),
)


def namespace_reference(name: str, title: str) -> str:
    """Markdown with one mkdocstrings entry per name of ``partitioning.<name>.__all__``."""
    import importlib

    module = importlib.import_module(f"partitioning.{name}")
    out = [
        f"# {title}",
        "",
        f"`pt.{name}` (`partitioning.{name}`), generated from the docstrings; the package's own page lists its "
        "modules. Examples assume what the [core reference](../api.md) assumes.",
        "",
        f"::: partitioning.{name}",
        "    options:",
        "      heading_level: 2",
        "      members: false",
        "",
    ]
    for member in module.__all__:
        out += [f"::: partitioning.{name}.{member}", "    options:", "      heading_level: 3", ""]
    return "\n".join(out) + "\n"


# -- hooks ----------------------------------------------------------------------------------------


def _nav_pages(nav: Any) -> set[str]:
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, dict):
        return set().union(*(_nav_pages(v) for v in nav.values()))
    if isinstance(nav, list):
        return set().union(*(_nav_pages(v) for v in nav)) if nav else set()
    return set()


def _add_missing_guides(files: Files, config: Any) -> None:
    listed = _nav_pages(config["nav"])
    missing = sorted(f.src_uri for f in files.documentation_pages() if f.src_uri not in listed)
    if not missing:
        return
    guides = next(item["Guides"] for item in config["nav"] if isinstance(item, dict) and "Guides" in item)
    for uri in missing:
        first = (Path(config["docs_dir"]) / uri).read_text().lstrip().splitlines()[0]
        guides.append({first.lstrip("# ").strip() or uri: uri})


@event_priority(100)  # before mkdocs-jupyter looks for notebooks among the files
def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, "reference/config.md", content=config_reference()))
    files.append(File.generated(config, "reference/api.md", content=api_reference()))
    for name, title in NAMESPACES:
        files.append(File.generated(config, f"reference/api/{name}.md", content=namespace_reference(name, title)))
    files.append(File.generated(config, "changelog.md", abs_src_path=str(REPO / "CHANGELOG.md")))
    for nb in sorted((REPO / "notebooks").glob("*.ipynb")):
        # A real file under the repository (not File.generated): mkdocs-jupyter's wrapper reads src_dir.
        files.append(File(f"notebooks/{nb.name}", str(REPO), config.site_dir, config.use_directory_urls))
    _add_missing_guides(files, config)
    return files
