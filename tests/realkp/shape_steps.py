"""What the pipeline records for a node of another shape (tests/realkp/shapes.py), beside the
scenarios every node runs; asserted by tests/realkp/test_shapes.py.

Recorded into `NodeRun.shape` (JSON, $VM_OUT/realkp/<node>/shape.json), nothing asserted here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from tests.realkp import state as st
from tests.realkp.node import KubeProxy, NodeNet, ns_run
from tests.realkp.shapes import Shape, arp_sysctls, vm_has_no_config


class _Run(Protocol):
    rc: int
    stdout: str
    stderr: str


AgentFn = Callable[..., _Run]


def read_arp(net: NodeNet) -> dict[str, str]:
    # every interface's arp_* under /proc/sys (the namespace's own): `sysctl -a` reads all
    text = ns_run(net.ns, "sh", "-c", "grep -H . /proc/sys/net/ipv4/conf/*/arp_*", check=False)
    return arp_sysctls(text)


def _agent_doc(r: _Run) -> dict[str, Any]:
    return {"rc": r.rc, "stdout": r.stdout, "stderr": r.stderr[-3000:]}


def server_version(kubectl: Callable[..., str]) -> str:
    """The API server's own word for its release (`kubectl version`), not the tier's plan."""
    doc = json.loads(kubectl("version", "-o", "json"))
    return str(doc.get("serverVersion", {}).get("gitVersion", ""))


def after_scenario(
    shape: Shape,
    name: str,
    net: NodeNet,
    kp: KubeProxy,
    agent: AgentFn,
    work: Path,
    out: dict[str, Any],
) -> None:
    """The shape's own checks once scenario `name` ran (and its restore gave the node back)."""
    doc: dict[str, Any] = {}
    if shape.kubeadm:
        # the agent must find kube-proxy's --config inside kube-proxy's own root
        doc["pid"] = (
            kp.proc.pid if kp.proc else None
        )  # ip netns exec, unshare, sh, chroot: each execs
        doc["vm_root_has_config"] = not vm_has_no_config()
        doc["precheck"] = _agent_doc(agent(net.ns, "precheck", "--json"))
    if shape.strict_arp and name == "B":
        doc["reset"] = _reset_arp(net, agent, work)
    if not shape.ipset and name == "A":
        # what kube-proxy said about the sets it could not destroy: nothing
        doc["ipset_log"] = [line for line in kp.tail(None).splitlines() if "ipset" in line]
    out[name] = doc


def _reset_arp(net: NodeNet, agent: AgentFn, work: Path) -> dict[str, Any]:
    """`cleanup --apply --reset-arp-sysctls` on the scenario's node (as its restore gave it
    back), then `restore` of that cleanup's bundle: the sysctls and the state at each step."""
    backups = work / f"{net.ns}-reset-arp-backups"
    lock = ["--lock-file", str(work / f"{net.ns}.lock")]
    before, arp_before = st.read(net), read_arp(net)
    cleanup = agent(
        net.ns, "cleanup", "--apply", "--reset-arp-sysctls", "--backup-dir", str(backups), *lock
    )
    after, arp_after = st.read(net), read_arp(net)
    bundles = sorted(p for p in backups.glob("*") if p.is_dir()) if backups.exists() else []
    restore = agent(net.ns, "restore", *lock, str(bundles[0])) if bundles else None
    return {
        "arp_before": arp_before,
        "arp_after": arp_after,
        "arp_restored": read_arp(net),
        "cleanup": _agent_doc(cleanup),
        "restore": _agent_doc(restore) if restore else None,
        "before": before.__dict__,
        "after": after.__dict__,
        "restored": st.read(net).__dict__,
    }
