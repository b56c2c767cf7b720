"""agent/ stays readable in pieces: no module over 500 lines, no function over 60 (from its
`def` line to its last; a click command's option decorators are declarations, not counted).
And no `assert` in agent/: `python -O` strips them, so a check the code relies on (narrowing a
type included) is an explicit test that raises."""

from __future__ import annotations

import ast
from pathlib import Path

AGENT = Path(__file__).resolve().parents[2] / "agent"
MAX_FILE, MAX_FUNCTION = 500, 60


def test_no_module_over_500_lines() -> None:
    long = {
        str(p.relative_to(AGENT.parent)): n
        for p in AGENT.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_FILE
    }
    assert not long, long


def test_no_function_over_60_lines() -> None:
    long = {}
    for p in AGENT.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                where = f"{p.relative_to(AGENT.parent)} {node.name}"
                if n > MAX_FUNCTION:
                    long[f"{where} (line {node.lineno})"] = n
    assert not long, long


def test_no_assert_statement() -> None:
    asserts = [
        f"{p.relative_to(AGENT.parent)}:{node.lineno}"
        for p in AGENT.rglob("*.py")
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Assert)
    ]
    assert not asserts, asserts
