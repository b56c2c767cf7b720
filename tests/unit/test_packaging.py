"""Packaging: one place for the version, an SPDX license with its text, the tools' environment."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent import __version__
from agent.cli import main
from agent.readers import tools

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_the_version_is_written_once() -> None:
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    attr = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "agent.__version__"
    assert importlib.metadata.version("ipvs-leftovers") == __version__
    r = CliRunner().invoke(main, ["--version"])
    assert r.output == f"ipvs-leftovers, version {__version__}\n"


def test_no_other_file_of_the_package_or_its_docs_spells_the_version() -> None:
    """daemonset/ and the Dockerfile name an image tag (kustomize's images: sets it)."""
    literal = re.compile(rf"(?<![\d.]){re.escape(__version__)}(?![\d.])")
    places = [REPO / "pyproject.toml", REPO / "README.md", *(REPO / "docs").rglob("*.md")]
    places += [p for p in (REPO / "agent").rglob("*.py") if p.name != "__init__.py"]
    found = [str(p.relative_to(REPO)) for p in places if literal.search(p.read_text())]
    assert found == []
    assert (REPO / "agent" / "__init__.py").read_text().count(__version__) == 1


def test_spdx_license_and_its_text() -> None:
    assert PYPROJECT["project"]["license"] == "Apache-2.0"  # an SPDX expression (PEP 639)
    text = (REPO / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    meta = importlib.metadata.metadata("ipvs-leftovers")
    assert meta["License-Expression"] == "Apache-2.0"
    assert "LICENSE" in (meta.get_all("License-File") or [])


def test_tools_get_the_c_locale_and_the_xtables_lock_path_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("XTABLES_LOCKFILE", "/host/run/xtables.lock")
    monkeypatch.setenv("SOMETHING_ELSE", "x")
    env = dict(line.split("=", 1) for line in tools.run(["env"]).splitlines())
    assert env == {"LC_ALL": "C", "XTABLES_LOCKFILE": "/host/run/xtables.lock"}
    monkeypatch.delenv("XTABLES_LOCKFILE")
    assert tools.run(["env"]) == "LC_ALL=C\n"
