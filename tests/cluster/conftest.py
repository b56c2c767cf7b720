"""The cluster tier's one node, shared by every module of the tier: starting it (containerd,
the kubelet, the agent's image imported, real kube-proxy migrated from ipvs to nftables mode)
is most of the tier's time under software emulation, so one VM boot starts it once. A module
that changes the node (a cleanup, a restore, an install) leaves it as its own fixtures say, and
each module states what it needs in a fixture of its own rather than relying on the order the
modules run in."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.cluster.node import Node
from tests.cluster.pods import out_dir


@pytest.fixture(scope="session")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    n = Node(tmp_path_factory.mktemp("node"))
    try:
        n.start()
        n.migrate()
        yield n
    finally:
        n.stop()
        (out_dir() / "timings.json").write_text(json.dumps(n.timings, indent=1) + "\n")
        for log in n.work.glob("*.log"):
            (out_dir() / log.name).write_bytes(log.read_bytes())
