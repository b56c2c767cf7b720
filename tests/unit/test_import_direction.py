"""The tree shows the flow (README, "How it is built"): a module imports only its own stage or
the stages below it, and module-level imports form no cycle.

Stages, lowest first: the model (snapshot, names, exitcodes, logs, job) < the wire helpers in
agent/readers (netlink, ipvs_wire, iptables_save, tools, kernel, _timing) < the readers <
the centre (gate, findings, evidence, classify, collect, collection) < side by side,
agent/views, agent/cleanup (the plan and what changes a node) and agent/fleet (the operator's
commands that read the cluster and Prometheus), none of which imports another < agent/cli <
agent/__main__. Imports inside functions count for the direction; imports under
`if TYPE_CHECKING:` count for neither (they never run).
"""

from __future__ import annotations

import ast
import shutil
from collections.abc import Callable
from pathlib import Path

AGENT = Path(__file__).resolve().parents[2] / "agent"

MODEL = {"agent", "agent.snapshot", "agent.names", "agent.exitcodes", "agent.logs", "agent.job"}
WIRE = {
    f"agent.readers.{m}"
    for m in ("netlink", "ipvs_wire", "iptables_save", "tools", "kernel", "_timing")
}
CENTRE = {
    "agent.gate",
    "agent.findings",
    "agent.evidence",
    "agent.classify",
    "agent.collect",
    "agent.collection",
}
STAGES = ("model", "wire", "readers", "centre", "views", "cleanup", "fleet", "cli", "main")
# Stages on one floor: each stands on the centre and below, never on another of them.
SIDE_BY_SIDE = ("views", "cleanup", "fleet")


def stage(module: str) -> int:
    """Where an agent module sits in the flow."""
    if module in MODEL:
        return STAGES.index("model")
    if module in WIRE:
        return STAGES.index("wire")
    if module == "agent.readers" or module.startswith("agent.readers."):
        return STAGES.index("readers")
    if module in CENTRE:
        return STAGES.index("centre")
    for name in ("views", "cleanup", "fleet", "cli"):
        if module == f"agent.{name}" or module.startswith(f"agent.{name}."):
            return STAGES.index(name)
    if module == "agent.__main__":
        return STAGES.index("main")
    raise AssertionError(f"{module} has no stage: add it to tests/unit/test_import_direction.py")


def _modules(root: Path, package: str) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([package, *parts])] = path
    return out


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _visit(
    node: ast.AST,
    top: bool,
    module: str,
    is_package: bool,
    known: dict[str, Path],
    edges: list[tuple[str, bool]],
) -> None:
    if isinstance(node, ast.If) and _type_checking(node):
        for child in node.orelse:
            _visit(child, top, module, is_package, known, edges)
        return
    if isinstance(node, ast.Import):
        edges.extend((a.name, top) for a in node.names if a.name in known)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            here = module.split(".") if is_package else module.split(".")[:-1]
            here = here[: len(here) - node.level + 1]
            base = ".".join([*here, *([base] if base else [])])
        for a in node.names:
            target = f"{base}.{a.name}"
            if target in known:
                edges.append((target, top))
            elif base in known:
                edges.append((base, top))
    inner = top and not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
    for child in ast.iter_child_nodes(node):
        _visit(child, inner, module, is_package, known, edges)


def imports(root: Path, package: str) -> dict[str, list[tuple[str, bool]]]:
    """Each module's imports of the package's modules: (module, at module level)."""
    known = _modules(root, package)
    found: dict[str, list[tuple[str, bool]]] = {}
    for module, path in known.items():
        edges: list[tuple[str, bool]] = []
        for statement in ast.parse(path.read_text()).body:
            _visit(statement, True, module, path.name == "__init__.py", known, edges)
        found[module] = edges
    return found


def upward(graph: dict[str, list[tuple[str, bool]]], rank: Callable[[str], int]) -> list[str]:
    return sorted(
        f"{src} ({STAGES[rank(src)]}) imports {dst} ({STAGES[rank(dst)]})"
        for src, edges in graph.items()
        for dst, _ in edges
        if rank(dst) > rank(src)
    )


def sideways(graph: dict[str, list[tuple[str, bool]]], rank: Callable[[str], int]) -> list[str]:
    """Imports from one side-by-side stage into another."""
    side = {STAGES.index(name) for name in SIDE_BY_SIDE}
    return sorted(
        f"{src} ({STAGES[rank(src)]}) imports {dst} ({STAGES[rank(dst)]})"
        for src, edges in graph.items()
        for dst, _ in edges
        if rank(src) in side and rank(dst) in side and rank(dst) != rank(src)
    )


def cycles(graph: dict[str, list[tuple[str, bool]]]) -> list[list[str]]:
    """Cycles among module-level imports (an import of a package's module also runs the
    package's __init__, which is counted as its own edge when it is written)."""
    top = {m: sorted({d for d, at_top in e if at_top and d != m}) for m, e in graph.items()}
    found: list[list[str]] = []
    state: dict[str, int] = {}
    path: list[str] = []

    def walk(m: str) -> None:
        state[m] = 1
        path.append(m)
        for d in top.get(m, []):
            if state.get(d) == 1:
                found.append([*path[path.index(d) :], d])
            elif d not in state:
                walk(d)
        path.pop()
        state[m] = 2

    for m in sorted(top):
        if m not in state:
            walk(m)
    return found


def test_every_module_has_a_stage_and_nothing_imports_upward() -> None:
    graph = imports(AGENT, "agent")
    assert len(graph) > 40
    assert upward(graph, stage) == []


def test_views_cleanup_and_fleet_stand_side_by_side() -> None:
    assert sideways(imports(AGENT, "agent"), stage) == []


def test_module_level_imports_form_no_cycle() -> None:
    assert cycles(imports(AGENT, "agent")) == []


def test_the_check_finds_planted_upward_and_sideways_imports_and_a_planted_cycle(
    tmp_path: Path,
) -> None:
    tree = tmp_path / "agent"
    shutil.copytree(AGENT, tree, ignore=shutil.ignore_patterns("__pycache__"))
    links = tree / "readers" / "links.py"
    links.write_text(links.read_text() + "\nfrom agent.cli import common  # planted\n")
    step = tree / "fleet" / "step.py"
    step.write_text(step.read_text() + "\nfrom agent.cleanup import lock  # planted\n")
    conn = tree / "views" / "connections.py"
    conn.write_text(conn.read_text() + "\nfrom agent.views import report  # planted\n")
    report = tree / "views" / "report.py"
    report.write_text(
        report.read_text() + "\nfrom agent.views.connections import Reading  # planted\n"
    )
    graph = imports(tree, "agent")
    assert upward(graph, stage) == [
        "agent.readers.links (readers) imports agent.cli.common (cli)",
    ]
    assert sideways(graph, stage) == [
        "agent.fleet.step (fleet) imports agent.cleanup.lock (cleanup)"
    ]
    assert ["agent.views.connections", "agent.views.report", "agent.views.connections"] in cycles(
        graph
    )


def test_function_level_and_type_checking_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "agent"
    (pkg / "readers").mkdir(parents=True)
    (pkg / "cli").mkdir()
    for f in ("__init__.py", "readers/__init__.py", "cli/__init__.py", "snapshot.py"):
        (pkg / f).write_text("")
    (pkg / "readers" / "ipvs.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from agent.cli import main\n"
        "def f():\n    from agent.cli import main\n"
    )
    graph = imports(pkg, "agent")
    assert graph["agent.readers.ipvs"] == [("agent.cli", False)]
    assert upward(graph, stage) == ["agent.readers.ipvs (readers) imports agent.cli (cli)"]
    assert cycles(graph) == []
