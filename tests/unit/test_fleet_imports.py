"""The Kubernetes client (the [fleet] extra) is never imported by the node agent: not by any
module outside agent/fleet, and not when a node command runs (checked in a fresh interpreter,
with the client made unimportable: a node command must not even try)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

AGENT = Path(__file__).resolve().parents[2] / "agent"
CLIENTS = ("kubernetes", "urllib3", "requests", "google")


def test_no_module_outside_agent_fleet_imports_the_kubernetes_client() -> None:
    bad = []
    for path in sorted(AGENT.rglob("*.py")):
        if "fleet" in path.relative_to(AGENT).parts[:1]:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            bad += [f"{path.relative_to(AGENT)}: {n}" for n in names if n.split(".")[0] in CLIENTS]
    assert bad == []


def test_agent_fleet_imports_the_client_only_inside_functions() -> None:
    for path in sorted((AGENT / "fleet").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                mod = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                assert (mod or "").split(".")[0] not in CLIENTS, f"{path}: {mod}"


def test_node_commands_run_without_the_client() -> None:
    """A fresh interpreter where `import kubernetes` fails: every node command still loads,
    and no client module ends up in sys.modules."""
    script = """
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] in BLOCKED:
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
from click.testing import CliRunner
from agent.cli import main, COMMANDS
import importlib
for name, target in COMMANDS.items():
    if name.startswith('fleet') or name == 'job-manifest':
        continue
    module, fn = target.split(':')
    importlib.import_module(module)
import agent.cleanup.autoclean, agent.views.metrics, agent.cleanup.procedure
r = CliRunner().invoke(main, ['job-manifest', '--node', 'n1', '--image', 'i:1'])
assert r.exit_code == 0, r.output
print(sorted(m for m in sys.modules if m.split('.')[0] in BLOCKED))
""".replace("BLOCKED", repr(CLIENTS))
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
