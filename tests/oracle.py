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
# The chains kube-proxy's ipvs mode creates (docs/kube-proxy-names.md) and older releases',
# as the lab writes them.
IPVS_CHAINS: dict[str, set[str]] = {table: set(chains) for table, chains in n.CHAINS.items()}
IPVS_CHAINS["nat"].add(n.OLD_NAT_FIREWALL)
JUMP_COMMENTS = {comment for _, _, _, comment in n.JUMPS} | {n.OLD_FORWARD_JUMP[3]}
JUMP_COMMENTS |= {comment for _, _, _, comment, _ in n.IPTABLES_MODE_JUMPS}
# Shared names whose rules are the same in both modes (or a chain left empty): README
# "Decisions" gives them the table's mode, ipvs when any ipvs-mode-only chain is there.
SAME_IN_BOTH_MODES = {("nat", n.POSTROUTING), ("nat", n.MARK_MASQ)}


def is_iptables_mode_chain(table: str, chain: str) -> bool:
    """A chain only kube-proxy's iptables mode makes, as the lab writes it."""
    shared = chain in IPVS_CHAINS.get(table, set())
    return not shared and (
        chain in n.IPTABLES_MODE_CHAINS.get(table, ())
        or chain == n.PROXY_CANARY
        or (table == "nat" and chain.startswith(n.IPTABLES_MODE_PREFIXES))
    )


def chain_modes(node: Node, table: str, text: str) -> dict[str, str]:
    """kube-proxy's chains of one restore text -> "ipvs" | "iptables", from what the lab
    wrote last into each (iptables mode runs after ipvs mode in the lab)."""
    declared = re.findall(r"^:(\S+)", text, re.M)
    rules = [shlex.split(r) for r in re.findall(r"^-[AI] (.*)$", text, re.M)]
    ipvs_only = any(
        c in IPVS_CHAINS.get(table, set()) and c not in n.IPTABLES_MODE_CHAINS.get(table, ())
        for c in declared
    )
    out: dict[str, str] = {}
    for chain in declared:
        if is_iptables_mode_chain(table, chain):
            out[chain] = "iptables"
        elif chain in IPVS_CHAINS.get(table, set()):
            shared = chain in n.IPTABLES_MODE_CHAINS.get(table, ())
            if not (shared and node.iptables_mode):
                out[chain] = "ipvs"
                continue
            neutral = (table, chain) in SAME_IN_BOTH_MODES or not any(r[0] == chain for r in rules)
            out[chain] = "ipvs" if neutral and ipvs_only else "iptables"
    return out


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

    chains: dict[str, list[dict[str, Any]]] = {"ipvs": [], "iptables": []}
    jumps = {"ipvs": 0, "iptables": 0}
    for family in node.families:
        for table, text in render.iptables_restore(node, family).items():
            rules = [shlex.split(r) for r in re.findall(r"^-[AI] (.*)$", text, re.M)]
            modes = chain_modes(node, table, text)
            for chain, mode in modes.items():
                chains[mode].append(
                    {
                        "backend": node.backend,
                        "family": family,
                        "table": table,
                        "chain": chain,
                        "rules": sum(1 for r in rules if r[0] == chain),
                    }
                )
            for r in rules:
                target = r[r.index("-j") + 1] if "-j" in r else ""
                if r[0] in BUILTIN and target in modes:
                    jumps[modes[target]] += 1

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
        "iptables_chains": sorted(chains["ipvs"], key=_chain_key),
        "iptables_jump_rules": jumps["ipvs"],
        "iptables_leftovers": {
            "chains": sorted(chains["iptables"], key=_chain_key),
            "jump_rules": jumps["iptables"],
        },
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
        "iptables_leftovers": {
            "chains": sorted(doc["iptables_leftovers"]["chains"], key=_chain_key),
            "jump_rules": doc["iptables_leftovers"]["jump_rules"],
        },
        "ipvs_virtual_servers": left["ipvs_virtual_servers"],
        "ipvs_real_servers": left["ipvs_real_servers"],
        "foreign": doc["foreign"],
        "kube_ipvs0_present": left["kube_ipvs0"]["present"],
        "kube_ipvs0_addresses": left["kube_ipvs0"]["addresses"],
    }
