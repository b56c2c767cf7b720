"""What `audit --json` must report for a lab node, computed from the texts the lab fed to the
kernel (never from the agent's own reading or classification code)."""

from __future__ import annotations

import re
import shlex
from typing import Any

from lab import names as n
from lab import render
from lab.model import Node

BUILTIN = {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"}
# The chains kube-proxy's ipvs mode creates (reference §2.1) and older releases' (§2.4),
# as the lab writes them.
IPVS_CHAINS: dict[str, set[str]] = {table: set(chains) for table, chains in n.CHAINS.items()}
IPVS_CHAINS["nat"].add(n.OLD_NAT_FIREWALL)
JUMP_COMMENTS = {comment for _, _, _, comment in n.JUMPS}


def _family_of_set(name: str) -> str:
    return "ipv6" if name.startswith("KUBE-6-") else "ipv4"


def expected(node: Node) -> dict[str, Any]:
    sets = {"ipv4": 0, "ipv6": 0}
    entries = {"ipv4": 0, "ipv6": 0}
    for line in render.ipset_restore(node).splitlines():
        words = line.split()
        if len(words) > 1 and words[1].startswith("KUBE-"):
            if words[0] == "create":
                sets[_family_of_set(words[1])] += 1
            elif words[0] == "add":
                entries[_family_of_set(words[1])] += 1

    chains: list[dict[str, Any]] = []
    jumps = 0
    for family in node.families:
        for table, text in render.iptables_restore(node, family).items():
            declared = re.findall(r"^:(\S+)", text, re.M)
            rules = [shlex.split(r) for r in re.findall(r"^-[AI] (.*)$", text, re.M)]
            for chain in declared:
                if chain in IPVS_CHAINS.get(table, ()) and chain not in BUILTIN:
                    n = sum(1 for r in rules if r[0] == chain)
                    chains.append(
                        {
                            "backend": node.backend,
                            "family": family,
                            "table": table,
                            "chain": chain,
                            "rules": n,
                        }
                    )
            for r in rules:
                if (
                    r[0] in BUILTIN
                    and "-j" in r
                    and r[r.index("-j") + 1] in IPVS_CHAINS.get(table, ())
                ):
                    jumps += 1

    kube_vs = kube_rs = foreign_vs = foreign_rs = 0
    third = render._keepalived_services() if node.third_party else []
    for line in render.ipvsadm_restore(node).splitlines():
        foreign = line in third
        if line.startswith("-A "):
            if foreign:
                foreign_vs += 1
            else:
                kube_vs += 1
        elif line.startswith("-a "):
            if foreign:
                foreign_rs += 1
            else:
                kube_rs += 1

    addrs = {"ipv4": 0, "ipv6": 0}
    batch = render.ip_batch(node)
    for line in batch.splitlines():
        if line.startswith("address add"):
            addrs["ipv6" if ":" in line.split()[2] else "ipv4"] += 1
    return {
        "ipsets": sets,
        "ipset_entries": entries,
        "iptables_chains": sorted(chains, key=_chain_key),
        "iptables_jump_rules": jumps,
        "ipvs_virtual_servers": kube_vs,
        "ipvs_real_servers": kube_rs,
        "foreign": {"ipvs_virtual_servers": foreign_vs, "ipvs_real_servers": foreign_rs},
        "kube_ipvs0_present": bool(batch),
        "kube_ipvs0_addresses": addrs,
    }


def _chain_key(c: dict[str, Any]) -> tuple[str, ...]:
    return (c["backend"], c["family"], c["table"], c["chain"])


def actual(doc: dict[str, Any]) -> dict[str, Any]:
    """The same view of an `audit --json` document."""
    left = doc["leftovers"]
    return {
        "ipsets": left["ipsets"],
        "ipset_entries": left["ipset_entries"],
        "iptables_chains": sorted(left["iptables_chains"], key=_chain_key),
        "iptables_jump_rules": left["iptables_jump_rules"],
        "ipvs_virtual_servers": left["ipvs_virtual_servers"],
        "ipvs_real_servers": left["ipvs_real_servers"],
        "foreign": doc["foreign"],
        "kube_ipvs0_present": left["kube_ipvs0"]["present"],
        "kube_ipvs0_addresses": left["kube_ipvs0"]["addresses"],
    }
