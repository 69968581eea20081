"""The documentation: the configuration reference is what the config structs say, and
`mkdocs build --strict` builds both languages without a warning."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from config_reference import config_keys, meanings, reference_markdown

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_config_key_has_a_meaning_in_both_languages(lang):
    """English: the ``#:`` comment above each field of the config structs; Chinese:
    docs/zh/config-meanings.toml. No key without one, no meaning for a key that is gone."""
    found = meanings(lang)
    assert set(found) == config_keys()
    assert all(text.strip() for text in found.values())


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_configuration_reference_pages_are_generated_from_the_structs(lang):
    page = ROOT / "docs" / lang / "config-reference.md"
    assert page.read_text() == reference_markdown(lang), (
        f"regenerate: python tools/config_reference.py {lang} > {page.relative_to(ROOT)}")


def test_both_languages_have_the_same_pages():
    en = sorted(p.name for p in (ROOT / "docs" / "en").glob("*.md"))
    zh = sorted(p.name for p in (ROOT / "docs" / "zh").glob("*.md"))
    assert en == zh


def test_mkdocs_builds_strict(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    if mkdocs is None:
        pytest.skip("mkdocs not installed (it comes with the dev extra: pip install '.[dev]')")
    proc = subprocess.run([mkdocs, "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "site" / "en" / "config-reference" / "index.html").exists()
    assert (tmp_path / "site" / "zh" / "benchmarks" / "index.html").exists()


def test_every_import_the_docs_show_works():
    """``from queue_rollout... import A, B`` in the docs and README: each name is there."""
    import importlib
    import re

    pages = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
    found = [(page.name, module, name.strip()) for page in pages
             for module, names in re.findall(r"from (queue_rollout[\w.]*) import ([\w, ]+)",
                                             page.read_text())
             for name in names.split(",") if name.strip()]
    assert ("trainer.md", "queue_rollout", "BarrierTimeout") in found
    missing, elsewhere = [], []
    for page, module, name in found:
        try:
            there = hasattr(importlib.import_module(module), name)
        except ModuleNotFoundError as exc:  # an integration whose framework is not here
            if exc.name not in ("areal", "torch"):
                raise
            elsewhere.append((page, module, name))
            continue
        if not there:
            missing.append(f"{page}: from {module} import {name}")
    assert missing == []
    assert {m for _, m, _ in elsewhere} <= {"queue_rollout.integrations.areal"}
    if elsewhere:  # checked where AReaL is (its venv; tests/queue_rollout/integrations)
        from real_engine.server import find_areal_python

        python = find_areal_python()
        if python is None:
            if os.environ.get("CI") == "true":
                pytest.fail("no AReaL venv to check the AReaL integration's imports in")
            return
        code = "; ".join(f"from {m} import {n}" for _, m, n in elsewhere)
        out = subprocess.run([python, "-c", code], capture_output=True, text=True,
                             timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.parametrize("page", ["grafana/README.md", "docs/en/operations.md",
                                  "docs/zh/operations.md"])
def test_the_alert_tables_list_every_alert_of_alerts_yml(page):
    """Each page's alert table (rows that start with an alert's name) names exactly the
    rules of grafana/alerts.yml, each once."""
    import re

    rules = re.findall(r"^\s*- alert: (\w+)\s*$", (ROOT / "grafana" / "alerts.yml").read_text(),
                       re.MULTILINE)
    assert len(rules) >= 7 and len(set(rules)) == len(rules)
    rows = re.findall(r"^\| `(QueueRollout\w+)` \|", (ROOT / page).read_text(), re.MULTILINE)
    assert sorted(rows) == sorted(rules)


def _first_bash_block(text: str) -> list[str]:
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_docs_quick_start_is_the_readme_s(lang):
    """The index page's two commands are the README's Quick start, letter for letter."""
    readme = _first_bash_block((ROOT / "README.md").read_text())
    assert len(readme) == 2 and readme[1].endswith("pytest -n auto")
    assert _first_bash_block((ROOT / "docs" / lang / "index.md").read_text()) == readme
