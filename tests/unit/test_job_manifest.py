from pathlib import Path

import pytest

from agent.job import render

REPO = Path(__file__).resolve().parents[2]


def test_committed_example_is_what_the_command_renders() -> None:
    committed = (REPO / "daemonset" / "cleanup-job.yaml").read_text()
    assert committed == render("example-node", "ghcr.io/example/ipvs-leftovers:0.1.0", apply=True)


def test_pinned_to_the_node_with_minimal_capabilities() -> None:
    text = render("worker-3.pool-a", "img:1")
    assert "nodeName: worker-3.pool-a" in text
    assert 'add: ["NET_ADMIN", "NET_RAW"]' in text and 'drop: ["ALL"]' in text
    assert "--apply" not in text.split("args:")[1].split("\n")[0]  # plan only by default
    assert '"--apply"' in render("worker-3", "img:1", apply=True)
    with pytest.raises(ValueError, match="not a valid node name"):
        render("Worker_3", "img:1")
