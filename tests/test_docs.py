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
# Pages tools/docs_hooks.py generates at build time (no file in docs/): they may be linked to.
GENERATED = {
    REPO / "docs" / "reference" / "config.md",
    REPO / "docs" / "reference" / "api.md",
    REPO / "docs" / "changelog.md",
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
