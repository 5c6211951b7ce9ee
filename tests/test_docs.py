"""The documentation: the site builds with ``mkdocs build --strict`` (no broken link, no missing reference,
every generated page there), and neither it nor the README points outside the repository."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import partitioning as pt

REPO = Path(__file__).resolve().parent.parent
# The namespaces of `import partitioning as pt`, a reference page each (tools/docs_hooks.py).
NAMESPACES = ("model", "data", "finetune", "decode", "parallel", "plan", "train", "checkpoint", "hf", "tune")
# Pages tools/docs_hooks.py generates at build time (no file in docs/): they may be linked to.
GENERATED = {
    REPO / "docs" / "reference" / "config.md",
    REPO / "docs" / "reference" / "api.md",
    REPO / "docs" / "changelog.md",
    *(REPO / "docs" / "reference" / "api" / f"{ns}.md" for ns in NAMESPACES),
}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-5000:]
    return out


def test_the_api_reference_documents_every_public_name(site):
    api = (site / "reference" / "api" / "index.html").read_text()
    missing = [name for name in pt.__all__ if f'id="partitioning.{name}"' not in api]
    assert missing == []


def test_each_namespace_has_a_reference_page_documenting_every_name(site):
    for ns in NAMESPACES:
        module = getattr(pt, ns)
        page = (site / "reference" / "api" / ns / "index.html").read_text()
        missing = [name for name in module.__all__ if f'id="partitioning.{ns}.{name}"' not in page]
        assert missing == [], ns


def test_the_config_reference_is_generated_from_the_schema(site):
    from partitioning.config.schema import SECTIONS

    page = (site / "reference" / "config" / "index.html").read_text()
    for section, cls in SECTIONS.items():
        assert f'id="{section}"' in page
        for name, field in cls.model_fields.items():
            if not field.exclude:
                assert f"<code>{field.alias or name}</code>" in page, (section, name)


def test_the_notebooks_are_rendered_as_they_were_executed(repo, site):
    for nb in sorted((repo / "notebooks").glob("*.ipynb")):
        assert (site / "notebooks" / nb.stem / "index.html").exists(), nb.name


def test_links_stay_inside_the_repository(repo):
    pages = [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+://", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            assert path.is_relative_to(repo.resolve()), f"{page.name}: {target} is outside the repository"
            assert path.exists() or path in GENERATED, f"{page.name}: {target} does not exist"


# Markup the site must never show: reST left in a docstring (tools/docs_rest.py renders it) or text that
# Markdown ate. Each names the page and the snippet, with some context.
_LEFTOVER = re.compile(r"\w::|(?<![\w`]):(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj):|``")


def _text(html: str) -> str:
    import html as html_lib

    return html_lib.unescape(re.sub(r"<[^>]+>", "", html))


@pytest.mark.parametrize("page", ["reference/api", "reference/config"])
def test_the_reference_pages_show_no_rest_markup(site, page):
    html = (site / page / "index.html").read_text()
    # The rendered text, code blocks included: "Example::" or "``x``" in a doctest's block shows too.
    main = _text(html.split('<article class="md-content__inner', 1)[1].split("</article>", 1)[0])
    leftovers = [main[max(m.start() - 60, 0) : m.end() + 60] for m in _LEFTOVER.finditer(main)]
    assert leftovers == [], f"{page}: {len(leftovers)} leftover reST, the first: {leftovers[:3]}"


def test_docstring_examples_render_as_highlighted_doctests_and_roles_as_links(site):
    html = (site / "reference" / "api" / "index.html").read_text()
    assert "<p>Example:</p>" in html  # "Example::" reads as reST renders it
    assert '<span class="gp">&gt;&gt;&gt; </span>' in html  # a fenced pycon block: prompts highlighted
    # boxes.py's ":class:`~partitioning.Annotations`" is a link to that entry, shown as code.
    assert 'href="#partitioning.Annotations"><code>Annotations</code></a>' in html


def test_the_config_reference_shows_every_description_as_written(site):
    from partitioning.config.schema import json_schema

    schema = json_schema()
    page = (site / "reference" / "config" / "index.html").read_text()
    shown: dict[tuple[str, str], str] = {}
    for part in page.split("<h2 id=")[1:]:
        section = part.split('"', 2)[1]
        for row in re.findall(r"<tr>(.*?)</tr>", part, re.S):
            cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
            if cells:
                shown[section, _text(cells[0])] = _text(cells[-1])
    sections = {"top-level": schema}
    sections |= {k: schema["$defs"][p["$ref"].split("/")[-1]] for k, p in schema["properties"].items() if "$ref" in p}
    checked = 0
    for section, sub in sections.items():
        for name, prop in sub["properties"].items():
            if "$ref" in prop or (section, name) not in shown:  # a section's row links to it; excluded keys
                continue
            want = prop.get("description", "").replace("`", "")
            assert shown[section, name] == want, f"reference/config: {section}.{name} reads {shown[section, name]!r}"
            checked += 1
    assert checked > 50
    assert "{hf: checkpoint dir, scan_layers, remat, ...}" in shown["top-level", "model"]
    assert "{_target_: module.Class, ...}" in shown["top-level", "model"]


def test_rest_literal_blocks_become_fences_in_the_language_they_read_as(repo):
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_rest", repo / "tools" / "docs_rest.py")
    assert spec is not None and spec.loader is not None
    docs_rest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(docs_rest)
    text = (
        "Example::\n\n    >>> 1 + 1\n    2\n\n"
        "Example (``my.yaml``)::\n\n    name: gpu\n\n"
        "Run::\n\n    $ partitioning train x.yaml\n\n"
        "Not run::\n\n    import partitioning as pt\n\n    pt.f(1)\n\n"
        "A hook has some of ::\n\n    on_start(state) -> state\n"
        "The end::"
    )
    assert docs_rest.literal_blocks(text).split("\n") == [
        *["Example:", "", "```pycon", ">>> 1 + 1", "2", "```", ""],
        *["Example (``my.yaml``):", "", "```yaml", "name: gpu", "```", ""],
        *["Run:", "", "```console", "$ partitioning train x.yaml", "```", ""],
        *["Not run:", "", "```python", "import partitioning as pt", "", "pt.f(1)", "```", ""],
        *["A hook has some of", "", "```text", "on_start(state) -> state", "```", ""],
        "The end::",  # nothing indented follows: not a literal block
    ]
