"""The runbooks' commands, read as an operator types them: each one reaches the failing node
(never `kubectl logs ds/...`, which reads one arbitrary pod), and runs a tool where it exists
(the agent's image has no ip, nft or curl: those run on the node through `on_node`,
docs/runbooks/README.md). Static: the real-node tier runs the commands themselves."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNBOOKS = sorted((REPO / "docs" / "runbooks").glob("*.md"))
# What the image installs (Dockerfile) and the agent itself; iptables brings its -save tools.
IMAGE_TOOLS = {"ipvs-leftovers", "python3", "ipvsadm", "ipset", "iptables-legacy-save",
               "iptables-nft-save", "ip6tables-legacy-save", "ip6tables-nft-save"}  # fmt: skip
NODE_ONLY = {"ip", "nft", "curl", "tc", "ss", "conntrack"}
FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.S)
INLINE = re.compile(r"`([^`\n]+)`")


def commands(text: str) -> list[str]:
    """Every line of a fenced block and every inline code span that looks like a command."""
    out = [line for block in FENCE.findall(text) for line in block.splitlines()]
    # inline: a span of three words or more (`ip nat` names a table, `nft` a tool)
    out += [s for s in INLINE.findall(FENCE.sub("", text)) if len(s.split()) >= 3]
    return [c.split("#", 1)[0].strip() for c in out if c.strip()]


def test_the_image_installs_the_tools_the_runbooks_exec() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    for package in ("python3=", "iptables=", "ipset=", "ipvsadm="):
        assert package in dockerfile, package


def test_no_runbook_reads_one_arbitrary_pod_of_the_daemonset() -> None:
    bad = [f"{p.name}: {c}" for p in RUNBOOKS for c in commands(p.read_text()) if "ds/" in c]
    assert bad == []


def test_exec_into_the_agent_runs_only_what_its_image_has() -> None:
    seen = 0
    bad = []
    for p in RUNBOOKS:
        for c in commands(p.read_text()):
            for m in re.finditer(r"kubectl .*?\bexec\b.*? -- (\S+)", c):
                seen += 1
                if m.group(1) not in IMAGE_TOOLS:
                    bad.append(f"{p.name}: {c}")
    assert bad == []
    assert seen >= 10  # the check reads the runbooks' exec lines at all


def test_node_tools_run_on_the_node_not_in_the_agents_image() -> None:
    """`ip`, `nft`, `curl` typed bare would run on the operator's machine, or fail in the pod:
    each is `on_node TOOL` (a node debug pod, chroot /host), or curl from the operator's
    machine when the runbook says so."""
    bad = []
    for p in RUNBOOKS:
        for c in commands(p.read_text()):
            for segment in re.split(r"\||;|&&|\$\(", c):
                words = segment.split()
                if not words or words[0] not in NODE_ONLY:
                    continue
                if words[0] == "curl" and "9437" in segment:
                    continue  # the agent's own port, from where Prometheus scrapes
                bad.append(f"{p.name}: {c}")
    assert bad == []


def test_every_runbook_names_the_node_pod_helpers_it_uses() -> None:
    """A runbook that uses $POD, get or on_node links to where they are defined."""
    bad = []
    for p in RUNBOOKS:
        if p.name == "README.md":
            continue
        text = p.read_text()
        uses = "$POD" in text or "`get " in text or "on_node" in text
        if uses and "README.md#" not in text:
            bad.append(p.name)
    assert bad == []
