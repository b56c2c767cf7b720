"""Every kube-proxy and kubelet name and number is written once, in agent/names.py
(docs/kube-proxy-names.md says where upstream writes each).

The string literals of every other module of agent/ are read from their syntax tree
(docstrings left out: they explain, they do not match): none may hold a kube-proxy name. Code
that needs one imports it from agent.names.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

AGENT = Path(__file__).resolve().parents[2] / "agent"
HOME = AGENT / "names.py"

# A literal that is one of kube-proxy's names, or holds one of its numbers. Prose that
# mentions a name ("rules that reference KUBE-* chains") is not a name.
NAMES = {
    "a KUBE- chain or set name": re.compile(r"^\s*" + "KUBE" + "-"),
    "the ipvs mode's dummy link": re.compile("^" + "kube" + "-ipvs0$"),
    "kube-proxy's ports": re.compile(":1024" + r"9\b|:1025" + r"6\b"),
    "kube-proxy's probe service": re.compile(r"198\.51\.100" + r"\.0\b"),
}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def literals(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string literal of a module that is not a docstring."""
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
    ]


def offenders(root: Path, home: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        if path == home:
            continue
        for line, text in literals(path):
            for what, pattern in NAMES.items():
                if pattern.search(text):
                    found.append(f"{path.relative_to(root.parent)}:{line}: {what}: {text!r}")
    return found


def test_kube_proxy_names_are_written_only_in_names_py() -> None:
    found = offenders(AGENT, HOME)
    assert not found, "import these from agent.names:\n" + "\n".join(found)


def test_the_check_sees_a_literal_and_not_a_docstring_or_a_comment(tmp_path: Path) -> None:
    pkg = tmp_path / "agent"
    pkg.mkdir()
    (pkg / "names.py").write_text('MASQ = "KUBE-' + 'MARK-MASQ"\n')
    (pkg / "clean.py").write_text(
        '"""Mentions KUBE-' + 'MARK-MASQ in prose."""\n'
        "# and KUBE-" + "POSTROUTING in a comment\n"
        "from agent.names import MASQ\n"
        "def f() -> str:\n"
        '    """KUBE-' + 'SERVICES here too."""\n'
        "    return MASQ\n"
    )
    (pkg / "dirty.py").write_text(
        'CHAIN = "KUBE-' + 'MARK-MASQ"\n'
        'TEXT = "rules that reference KUBE-' + '* chains"\n'
        'LINK = "kube' + '-ipvs0"\n'
        'URL = "http://127.0.0.1:1024' + '9"\n'
    )
    found = offenders(pkg, pkg / "names.py")
    assert [f.split(":")[1] for f in found] == ["1", "3", "4"], found
