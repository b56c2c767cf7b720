"""The agent's Pod on the cluster tier's node as the API server reports it, and where the
tier writes what it keeps (VM_OUT)."""

from __future__ import annotations

import json
from typing import Any

from tests.cluster.node import Node, out_dir

__all__ = ["NAMESPACE", "SELECTOR", "agent_pod", "out_dir", "pod_ready"]

NAMESPACE = "ipvs-leftovers"
SELECTOR = "app.kubernetes.io/name=ipvs-leftovers"


def agent_pod(
    node: Node, namespace: str = NAMESPACE, selector: str = SELECTOR
) -> dict[str, Any] | None:
    """The agent's one Pod in the namespace, or None while there is not exactly one."""
    items = json.loads(node.kubectl("-n", namespace, "get", "pods", "-l", selector, "-o", "json"))[
        "items"
    ]
    return items[0] if len(items) == 1 else None


def pod_ready(pod: dict[str, Any] | None) -> bool:
    if not pod:
        return False
    conds = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
    return conds.get("Ready") == "True"
