"""Every snippet of the README and of docs/*.md runs as a user pastes it, top to bottom, in a fresh folder.

The pages are walked in order (the README, then the docs in the order of
mkdocs.yml's nav, then any others), in two groups (the pages that use the README's
quickstart run after it, and the others), each in one folder holding a copy of the
shipped files (configs/, examples/, and the tiny Hugging Face checkpoints of
tests/fixtures/hf that configs/hf_tiny.yaml names), so a page can use what an
earlier one made (runs/quickstart). Markers in the Markdown say what each block must do
and which blocks are not run (and why): see tests/docswalk.py.

To keep the walk short, what it runs is shortened where the text allows, and
only there: step counts are divided by STEP_SCALE (in the copied configs, in
``train.steps=N``, ``steps: N`` and Python's ``steps=N``: the order of every
two step counts a page trains in turn is kept, so "already at step 200" stays true
as "already at step 4", and "steps 201-300" continue it as steps 5-6); plans and
searches of the Llama configs (2,048 devices) skip the XLA compile; the README's
"make a virtualenv and install" prefix of its first command is dropped (the walk runs in the test suite's environment,
where this checkout is installed). The text shown is never changed.
"""

import re
import shutil
from pathlib import Path

import pytest

from tests.docswalk import parse, user_env, walk

# Compiling and starting a process, not the steps, is most of a run's time; 4 steps still log, evaluate and save.
STEP_SCALE = 50
SHORTEN = [
    # The install before the quickstart: done already (the suite runs in that environment).
    (re.compile(r"python3 -m venv \.venv && \. \.venv/bin/activate && pip install -e \. && "), ""),
    # Step counts, divided (at least 2): train.steps=N, a YAML `steps: N`, Python's steps=N.
    (
        re.compile(r"(?<![\w.])((?:train\.)?steps(?:=|: ))(\d+)"),
        lambda m: f"{m.group(1)}{max(2, int(m.group(2)) // STEP_SCALE)}",
    ),
    # Llama on 2,048 devices: the table and the search, without the ~30 s XLA compile.
    (re.compile(r"(partitioning (?:plan|compare) configs/llama3_\S+)"), r"\1 --no-compile"),
    (re.compile(r"(partitioning tune configs/llama3_\S+)"), r"\1 --compile 0"),
]


def shorten(text: str) -> str:
    for pattern, repl in SHORTEN:
        text = pattern.sub(repl, text)
    return text


def pages(repo: Path) -> list[Path]:
    """README.md, then docs/*.md in mkdocs.yml's nav order, then the docs pages the nav leaves out."""
    docs = repo / "docs"
    found = sorted(docs.glob("**/*.md")) if docs.is_dir() else []
    order: list[Path] = []
    nav = repo / "mkdocs.yml"
    if nav.exists():
        for name in re.findall(r"([\w./-]+\.md)\b", nav.read_text()):
            p = docs / name
            if p in found and p not in order:
                order.append(p)
    readme = repo / "README.md"
    return [readme, *order, *[p for p in found if p not in order and p != readme]]


def shipped_copy(repo: Path, folder: Path) -> None:
    """configs/, examples/, tests/fixtures/hf and tests/fixtures/peft as a user's checkout has them (symlinks
    followed), with step counts shortened."""
    for name in ("configs", "examples", "tests/fixtures/hf", "tests/fixtures/peft"):
        if (repo / name).is_dir():
            shutil.copytree(repo / name, folder / name, symlinks=False, ignore=shutil.ignore_patterns("__pycache__"))
    for f in folder.glob("**/*.yaml"):
        f.write_text(shorten(f.read_text()))


def test_shortening_keeps_the_text_true():
    assert shorten("partitioning train configs/quickstart.yaml --set train.steps=50") == (
        "partitioning train configs/quickstart.yaml --set train.steps=2"
    )
    assert shorten("train:\n  steps: 200\n  warmup_steps: 20\n") == "train:\n  steps: 4\n  warmup_steps: 20\n"
    assert shorten("pt.fit(t, s, b, steps=200, log_every=10)") == "pt.fit(t, s, b, steps=4, log_every=10)"
    assert shorten("make_optimizer('adamw', total_steps=200)") == "make_optimizer('adamw', total_steps=200)"
    assert shorten("partitioning plan configs/llama3_70b.yaml --devices 2048") == (
        "partitioning plan configs/llama3_70b.yaml --no-compile --devices 2048"
    )
    install = "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && "
    quickstart = "partitioning train configs/quickstart.yaml"
    assert shorten(install + quickstart) == quickstart


PAGE = """\
# A page

<!-- skip: installs a package -->
```bash
pip install something-else
```

```bash
mkdir -p out && echo hello > out/a.txt
echo "made it"
```
<!-- expect: out/a.txt -->
<!-- stdout: made it -->

<!-- file: cfg.yaml -->
```yaml
steps: 200
```

```python
x = open("cfg.yaml").read()
```

```python
print(x.strip(), "and", 1 + 1)
```
<!-- stdout: steps: 4 and 2 -->

```bash
echo "error: no such thing" >&2; exit 2
```
<!-- exit: 2 -->

```text
not run
```
"""


def test_the_walker_runs_a_page_in_order_and_checks_what_each_block_says(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    blocks = parse(PAGE, "page.md")
    assert [(b.line, b.kind, b.skip) for b in blocks] == [
        (4, "bash", "installs a package"),
        (8, "bash", None),
        (16, "file", None),
        (20, "python", None),
        (24, "python", None),
        (29, "bash", None),
        (34, None, None),
    ]
    assert blocks[1].after == {"expect": ["out/a.txt"], "stdout": ["made it"]} and blocks[5].expected_exit() == 2
    said = []
    folder = tmp_path / "walk"
    folder.mkdir()
    failures = walk([page], folder, root=tmp_path, env=user_env(), shorten=lambda b: shorten(b.text), say=said.append)
    assert failures == [] and said == ["page.md:4: skipped (installs a package)"]
    # A block that does not do what its text says fails, naming the page and line.
    bad = PAGE.replace("echo hello > out/a.txt", "true").replace("1 + 1)", "1 + y)")
    page.write_text(bad)
    (tmp_path / "again").mkdir()
    failures = walk([page], tmp_path / "again", root=tmp_path, env=user_env(), say=said.append)
    assert [f.split("\n")[0].split(";")[0] for f in failures] == [
        "page.md:8 (bash): expected out/a.txt to exist (not empty)",
        "page.md:24 (python): exit status 1, expected 0",
    ] and "NameError: name 'y' is not defined" in failures[1]


# The pages that use what the README's quickstart run made (runs/quickstart) walk after it, in its folder; the
# others walk in a folder of their own, at the same time on another worker: two ~4-minute tests, not one of 8.
AFTER_QUICKSTART = {"README.md", "index.md", "training.md", "checkpoints.md", "errors.md", "pretrained.md"}


def walk_group(repo: Path, group: str) -> list[Path]:
    return [p for p in pages(repo) if (p.name in AFTER_QUICKSTART) == (group == "quickstart")]


def test_the_two_walks_cover_every_page_once(repo):
    both = walk_group(repo, "quickstart") + walk_group(repo, "others")
    assert sorted(both) == sorted(pages(repo)) and walk_group(repo, "quickstart")[0].name == "README.md"


@pytest.mark.slow
@pytest.mark.parametrize("group", ["quickstart", "others"])
def test_every_snippet_of_the_docs_runs_as_pasted(repo, tmp_path, capsys, group):
    folder = tmp_path / "walk"
    folder.mkdir()
    shipped_copy(repo, folder)
    said: list[str] = []
    timings: list[tuple[str, float]] = []
    failures = walk(
        walk_group(repo, group),
        folder,
        root=repo,
        env=user_env(),
        shorten=lambda b: shorten(b.text),
        say=said.append,
        timings=timings,
    )
    slowest = sorted(timings, key=lambda t: -t[1])[:5]
    said.append(
        f"{len(timings)} blocks in {sum(t for _, t in timings):.0f} s; slowest: "
        + ", ".join(f"{w} {t:.0f} s" for w, t in slowest)
    )
    with capsys.disabled():
        for line in said:
            print(f"\n  docs walk: {line}", end="")
    assert not failures, "\n\n".join(failures)


def test_every_block_that_is_not_run_says_why(repo):
    """A run block without a reason to be skipped runs; a skipped one names its reason (not just `skip`)."""
    unexplained = [b.where for p in pages(repo) for b in parse(p.read_text(), p.name) if b.skip == "marked skip"]
    assert unexplained == [], "use <!-- skip: REASON --> before these blocks"


# -- blocks the walk reads but does not run: run here with what they need ------------------------------------------


def section(repo: Path, title: str) -> list:
    """The blocks under the heading ``title`` (up to the next heading of its level), wherever the docs keep it."""
    for page in pages(repo):
        lines, fenced, start, level = page.read_text().splitlines(), False, None, 0
        for i, line in enumerate(lines):
            if line.lstrip().startswith("```"):
                fenced = not fenced
            m = None if fenced else re.match(r"^(#+) (.*?)\s*$", line)
            if m and start is not None and len(m.group(1)) <= level:
                return parse("\n".join(lines[start:i]), page.name)
            if m and m.group(2) == title and start is None:
                start, level = i + 1, len(m.group(1))
        if start is not None:
            return parse("\n".join(lines[start:]), page.name)
    raise AssertionError(f"no page has a heading {title!r}")


def test_the_yaml_that_turns_on_pipeline_and_expert_parallelism_plans(repo, tmp_path):
    from partitioning.config import load_config
    from partitioning.config.planning import plan_from_config

    def first_yaml(title):
        return next(b.text for b in section(repo, title) if b.lang == "yaml")

    small = ["train.batch_size=32", "train.seq_len=32"]
    pipe = tmp_path / "pp.yaml"
    pipe.write_text(
        "model: {name: gpt, embed: 64, heads: 4, mlp: 128, layers: 4}\n" + first_yaml("Pipeline parallelism")
    )
    plan, _ = plan_from_config(load_config(pipe, small), devices=8)
    p = plan.parallel["pipeline"]
    assert (plan.mesh, p["stages"], p["microbatches"], plan.errors) == ({"stage": 4, "data": 2}, 4, 8, [])
    moe = tmp_path / "moe.yaml"
    moe.write_text(first_yaml("Expert parallelism"))
    plan, _ = plan_from_config(load_config(moe, small), devices=8)
    e = plan.parallel["experts"]
    assert (plan.mesh, e["experts"], e["top_k"], e["expert_shards"], plan.errors) == (
        {"data": 1, "fsdp": 2, "expert": 4},
        8,
        2,
        4,
        [],
    )
    assert e["capacity"] == 10 and e["all_to_all_bytes"] > 0


STUB_TIKTOKEN = """
class _Encoding:
    eot_token = 50256

    def encode_ordinary(self, text):
        return [b + 200 * (i % 200) for i, b in enumerate(text.encode())]   # ids up to 40,055


def get_encoding(name):
    assert name == "gpt2"
    return _Encoding()
"""


def test_pretokenizing_example_makes_data_the_config_accepts(repo, tmp_path, run_cli_subprocess):
    """The walk skips the tiktoken block (it downloads GPT-2's BPE); here it runs with a stand-in tokenizer, and the
    config beside it accepts what it wrote."""
    import os
    import subprocess
    import sys

    blocks = section(repo, "Data")
    python = next(b.text for b in blocks if b.lang == "python" and "tiktoken" in b.text)
    config = next(b.text for b in blocks if b.lang == "yaml" and "data/train.npy" in b.text)
    (tmp_path / "stub").mkdir()
    (tmp_path / "stub" / "tiktoken.py").write_text(STUB_TIKTOKEN)
    (tmp_path / "my_text").mkdir()
    for i in range(4):
        (tmp_path / "my_text" / f"doc{i}.txt").write_text(f"document {i}: " + "some words here. " * 300)
    env = {**user_env(), "PYTHONPATH": str(tmp_path / "stub")}
    r = subprocess.run(
        [sys.executable, "-c", python], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (tmp_path / "run.yaml").write_text(
        config + "mesh: {shape: {data: 1, fsdp: -1}, devices: 8}\nrules: fsdp\ntrain: {batch_size: 8, seq_len: 16}\n"
    )
    r = run_cli_subprocess("check", "run.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("OK: run.yaml: model gpt") and os.path.getsize(tmp_path / "data" / "train.npy") > 0
