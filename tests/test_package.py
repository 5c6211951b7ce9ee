"""The package's shape: an acyclic import graph, models imported only where configs are built,
one installable top-level name, small modules, documented stages and public API."""

import ast
import importlib.util
import inspect
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import partitioning as pt

PKG = Path(pt.__file__).resolve().parent
# The reference models: the repository's top-level `models/`, installed as `partitioning.models`.
MODELS = Path(importlib.util.find_spec("partitioning.models").origin).resolve().parent
MAX_LINES = 400


def _sources() -> list[tuple[Path, str]]:
    """(file, dotted module name) of every module of the installed package, models included."""
    out = []
    for root, prefix in ((PKG, ("partitioning",)), (MODELS, ("partitioning", "models"))):
        for f in sorted(root.rglob("*.py")):
            parts = list(prefix + f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out.append((f, ".".join(parts)))
    return out


def _modules() -> dict[str, Path]:
    return {name: f for f, name in _sources()}


def test_models_live_in_the_top_level_folder_and_install_as_partitioning_models():
    assert PKG.parent / "models" == MODELS
    assert not (PKG / "models").exists()


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports, at module level or inside functions."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # `from pkg import mod` imports the module pkg.mod; `from mod import name`, mod.
                targets = [
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module for a in node.names
                ]
            elif isinstance(node, ast.ImportFrom) and node.level:
                raise AssertionError(f"{path}: relative import; use absolute imports")
            graph[mod].update(t for t in targets if t in mods and t != mod)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n) :] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_import_graph_is_acyclic():
    graph = import_graph()
    assert len(graph) > 30
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_cycle_finder_finds_cycles():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


# The stages, bottom to top (docs/architecture.md): a module imports only from its own stage and the stages
# before it here. "core" is the top-level modules (rules, boxes, mesh, layout, ...); "face" the package's
# __init__ (the public API re-exports every stage below the CLI).
STAGES = (
    "core",
    "model",
    "parallel",
    "data",
    "decode",
    "finetune",
    "models",
    "plan",
    "train",
    "checkpoint",
    "hf",
    "tune",
    "config",
    "face",
    "cli",
)


def stage_of(module: str) -> str:
    parts = module.split(".")
    if module == "partitioning":
        return "face"
    if module == "partitioning.__main__":
        return "cli"
    return parts[1] if len(parts) > 2 or f"partitioning.{parts[1]}" in _packages() else "core"


def _packages() -> set[str]:
    return {name for f, name in _sources() if f.name == "__init__.py"}


def climbs(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a stage to one above it: ``"a -> b (stage -> stage)"``."""
    out = []
    for mod, deps in sorted(graph.items()):
        here = STAGES.index(stage_of(mod))
        for dep in sorted(deps):
            if STAGES.index(stage_of(dep)) > here:
                out.append(f"{mod} -> {dep} ({stage_of(mod)} -> {stage_of(dep)})")
    return out


def test_each_stage_imports_only_the_stages_below_it():
    graph = import_graph()
    assert {stage_of(m) for m in graph} == set(STAGES)
    assert climbs(graph) == []


def test_a_climbing_import_is_found():
    graph = {"partitioning.rules": {"partitioning.train.step"}, "partitioning.train.step": {"partitioning.rules"}}
    assert climbs(graph) == ["partitioning.rules -> partitioning.train.step (core -> train)"]


def test_no_folder_holds_more_than_20_modules():
    crowded = {}
    for folder in [
        PKG,
        MODELS,
        *(p.parent for p in PKG.rglob("__init__.py")),
        *(p.parent for p in MODELS.rglob("__init__.py")),
    ]:
        n = len(list(folder.glob("*.py")))
        if n > 20:
            crowded[str(folder.relative_to(PKG.parent))] = n
    assert crowded == {}


def test_reference_models_are_imported_only_by_the_config_build_and_the_cli():
    importers = {
        m
        for m, deps in import_graph().items()
        if any(d == "partitioning.models" or d.startswith("partitioning.models.") for d in deps)
        and not m.startswith("partitioning.models")
    }
    # Loading a published checkpoint means building its family (partitioning.models.hf), so
    # hf.weights imports the models too, inside its functions, and so do the PEFT adapters that map onto a
    # family's name table: `import partitioning` stays model-free.
    assert importers == {
        "partitioning.config.build",
        "partitioning.hf.weights",
        "partitioning.hf.peft",
        "partitioning.hf.peft_config",
    }
    # The CLI reaches them only through the build step.
    assert all(
        m.startswith(("partitioning.cli", "partitioning.config", "partitioning.models"))
        for m, deps in import_graph().items()
        if "partitioning.config.build" in deps | {m}
    )


def test_import_partitioning_loads_no_reference_model():
    code = "import sys, partitioning; print([m for m in sys.modules if m.startswith('partitioning.models')])"
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_a_users_models_py_does_not_hide_the_builtin_models(tmp_path, repo):
    # Flax's examples all have a models.py; running beside one must still find gpt and mlp.
    (tmp_path / "models.py").write_text("raise ImportError('a user module, not ours')\n")
    code = "import partitioning.config.build, partitioning as pt; print(pt.model.model_names())"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['gpt', 'mlp']"


@pytest.mark.slow
def test_the_wheel_installs_only_partitioning(tmp_path, repo):
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(repo)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    wheel = next(tmp_path.glob("partitioning-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/", 1)[0] for n in names}
    assert top == {"partitioning", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    # The presets ship inside the package, so an installed wheel has them.
    assert "partitioning/presets/fsdp.yaml" in names and "partitioning/models/gpt.py" in names


def test_no_module_over_the_size_limit():
    long = {name: n for p, name in _sources() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_every_stage_folder_says_what_it_does_and_lists_its_modules():
    for init, pkg in _sources():
        if init.name != "__init__.py" or init.parent == PKG:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc.splitlines()) >= 3, f"{init}: the docstring should say what the stage does"
        for mod in sorted(init.parent.glob("*.py")):
            if mod.name != "__init__.py":
                assert f"{pkg}.{mod.stem}" in doc or f"~{pkg}.{mod.stem}" in doc, f"{init}: does not list {mod.stem}"


def test_every_module_has_a_docstring():
    missing = [
        str(p) for p, _ in _sources() if p.name != "__main__.py" and not ast.get_docstring(ast.parse(p.read_text()))
    ]
    assert missing == []


NAMESPACES = ("model", "data", "finetune", "decode", "parallel", "plan", "train", "checkpoint", "hf", "tune")


def test_the_top_level_is_the_core_vocabulary_and_the_rest_is_in_namespaces():
    assert len(pt.__all__) <= 60
    assert len(set(pt.__all__)) == len(pt.__all__)
    for ns in NAMESPACES:
        module = getattr(pt, ns)  # `import partitioning as pt` is enough
        assert module.__name__ == f"partitioning.{ns}"
        assert module.__all__ and all(hasattr(module, name) for name in module.__all__), ns
    # What moved is gone from the top level (pre-1.0: no aliases), and is found in its namespace.
    assert not hasattr(pt, "load_hf") and pt.hf.load_hf.__module__ == "partitioning.hf.weights"
    assert not hasattr(pt, "LoRA") and pt.finetune.LoRA.__module__ == "partitioning.finetune.lora"
    assert not hasattr(pt, "generate") or not callable(pt.generate)
    assert pt.data.load_corpus.__module__ == "partitioning.data.corpus"
    assert pt.tune.search.__module__ == "partitioning.tune.search"


def test_public_api_names_have_docstring_examples():
    lacking = []
    public = [(name, getattr(pt, name)) for name in pt.__all__]
    public += [(f"{ns}.{n}", getattr(getattr(pt, ns), n)) for ns in NAMESPACES for n in getattr(pt, ns).__all__]
    for name, obj in public:
        if not callable(obj):
            continue  # constants (pt.tune.PROFILES) are documented where they are defined
        if inspect.isclass(obj) and issubclass(obj, Exception):
            continue  # errors are documented by the messages they carry
        doc = inspect.getdoc(obj) or ""
        if "Example" not in doc and ">>>" not in doc:
            lacking.append(name)
    assert lacking == []


def test_the_version_is_written_once_and_the_changelog_has_it(repo):
    from importlib import metadata

    from partitioning.cli.main import version

    assert metadata.version("partitioning") == pt.__version__ == version()
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]  # read from partitioning/__init__.py
    assert f"## [{pt.__version__}]" in (repo / "CHANGELOG.md").read_text()
