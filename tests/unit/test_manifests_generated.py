"""daemonset/'s generated files are the chart's current render (scripts/render-manifests).

The unit tier has no helm, so this reads daemonset/generated.sha256, written by the last
render: every chart file (the inputs) and every generated file (the outputs) must still have
the recorded sha256. A chart edited without re-rendering, or a generated file edited by hand,
fails here with the command to run. scripts/check-manifests (the manifests tier) re-renders
with helm and compares byte for byte (render-manifests --check)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "render-manifests"


def check_stamp(repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(repo / "scripts" / "render-manifests"), "--check-stamp"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_committed_outputs_are_the_current_charts_render() -> None:
    p = check_stamp(REPO)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "as rendered" in p.stdout


def copy(tmp: Path) -> Path:
    for part in ("daemonset", "scripts/render-manifests"):
        src, dst = REPO / part, tmp / part
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            shutil.copy2(src, dst)
    return tmp


def test_a_chart_edit_without_a_render_is_stale(tmp_path: Path) -> None:
    repo = copy(tmp_path)
    values = repo / "daemonset/helm/ipvs-leftovers/values.yaml"
    values.write_text(values.read_text().replace("port: 9437", "port: 9438"))
    p = check_stamp(repo)
    assert p.returncode == 1
    assert p.stdout.splitlines() == [
        "render-manifests: stale: daemonset/helm/ipvs-leftovers/values.yaml: changed since the "
        "last render: run scripts/render-manifests"
    ]


def test_a_generated_file_edited_by_hand_is_stale(tmp_path: Path) -> None:
    repo = copy(tmp_path)
    for name in ("daemonset.yaml", "plain/ipvs-leftovers.rules.yaml"):
        path = repo / "daemonset" / name
        path.write_text(path.read_text() + "# edited\n")
    readme = repo / "daemonset/README.md"
    readme.write_text(readme.read_text().replace("| critical |", "| warning |", 1))
    p = check_stamp(repo)
    assert p.returncode == 1
    assert sorted(p.stdout.splitlines()) == sorted(
        f"render-manifests: stale: daemonset/{n}: edited by hand: run scripts/render-manifests"
        for n in ("README.md", "daemonset.yaml", "plain/ipvs-leftovers.rules.yaml")
    )


def test_prose_outside_the_alert_table_is_not_generated(tmp_path: Path) -> None:
    repo = copy(tmp_path)
    readme = repo / "daemonset/README.md"
    readme.write_text(readme.read_text() + "\nMore prose.\n")
    assert check_stamp(repo).returncode == 0


def test_a_new_chart_file_is_stale(tmp_path: Path) -> None:
    repo = copy(tmp_path)
    (repo / "daemonset/helm/ipvs-leftovers/templates/extra.yaml").write_text("# new\n")
    p = check_stamp(repo)
    assert p.stdout.splitlines() == [
        "render-manifests: stale: daemonset/helm/ipvs-leftovers/templates/extra.yaml: new chart "
        "file since the last render: run scripts/render-manifests"
    ]
