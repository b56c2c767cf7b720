"""The audit report: a JSON document (schema in docs/audit-json.md) and its human rendering."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent import __version__, exitcodes
from agent.classify import (
    AnyFinding,
    ChainRef,
    Classification,
    Finding,
    Owner,
    RuleRef,
    ipset_family,
)
from agent.snapshot import Ipset, IpvsService, Link, NftTable, Snapshot
from agent.views.signals import ipvs_feature_gate
from agent.views.sysctls import attribute

SCHEMA = 1
LIST_LIMIT = 20  # objects listed per class and source without --verbose


def _chain_rows(
    c: Classification, owner: Owner = Owner.IPVS_LEFTOVER
) -> tuple[list[dict[str, Any]], int]:
    rows = []
    for f in c.of(ChainRef, owner):
        table, chain = f.obj.table, f.obj.chain
        rows.append(
            {
                "backend": table.backend,
                "family": table.family,
                "table": table.name,
                "chain": chain.name,
                "rules": len(chain.rules),
            }
        )
    return rows, len(c.of(RuleRef, owner))


def _ipvs_counts(findings: list[Finding[IpvsService]]) -> dict[str, int]:
    services = [f.obj for f in findings]
    return {
        "ipvs_virtual_servers": len(services),
        "ipvs_real_servers": sum(len(s.dests) for s in services),
    }


def _connections(findings: list[Finding[IpvsService]]) -> dict[str, int]:
    """What deleting these virtual servers would cut (docs/contract.md#live-connections)."""
    return {
        "active": sum(f.obj.active_conns for f in findings),
        "inactive": sum(f.obj.inactive_conns for f in findings),
    }


def _by_family(findings: list[Finding[Ipset]], value: Callable[[Ipset], int]) -> dict[str, int]:
    out = {"ipv4": 0, "ipv6": 0}
    for f in findings:
        out[ipset_family(f.obj)] += value(f.obj)
    return out


def _leftovers(snap: Snapshot, c: Classification) -> dict[str, Any]:
    """The document's `leftovers`: the ipvs-mode objects on the node."""
    sets = c.of(Ipset, Owner.IPVS_LEFTOVER)
    chains, jumps = _chain_rows(c)
    link = snap.links.data.kube_ipvs0
    addrs = link.addresses if link else ()
    return {
        **_ipvs_counts(c.of(IpvsService, Owner.IPVS_LEFTOVER)),
        "kube_ipvs0": {
            "present": link is not None,
            "kind": link.kind if link else None,
            "up": link.up if link else None,
            "addresses": {
                "ipv4": sum(":" not in a for a in addrs),
                "ipv6": sum(":" in a for a in addrs),
            },
        },
        "ipsets": _by_family(sets, lambda s: 1),
        "ipset_entries": _by_family(sets, lambda s: s.elements),
        "iptables_chains": chains,
        "iptables_jump_rules": jumps,
    }


def document(snap: Snapshot, c: Classification) -> dict[str, Any]:
    """The stable `audit --json` document."""
    ipt_chains, ipt_jumps = _chain_rows(c, Owner.IPTABLES_LEFTOVER)
    return {
        "schema": SCHEMA,
        "agent_version": __version__,
        "kernel": snap.kernel.data.release,
        "mode": {
            "detected": c.mode.detected,
            "nftables_confirmed": c.mode.nftables_confirmed,
            "evidence": list(c.mode.evidence + c.mode.failed),
        },
        "sources": {
            name: {"status": r.status, "error": r.error, "seconds": round(r.seconds, 6)}
            for name, r in snap.sources().items()
        },
        "leftovers": _leftovers(snap, c),
        "foreign": _ipvs_counts(c.of(IpvsService, Owner.FOREIGN)),
        "ipvs_connections": {
            "leftovers": _connections(c.of(IpvsService, Owner.IPVS_LEFTOVER)),
            "foreign": _connections(c.of(IpvsService, Owner.FOREIGN)),
        },
        # kube-proxy iptables mode's chains (docs/contract.md#ownership), apart from the
        # ipvs-mode counts above
        "iptables_leftovers": {"chains": ipt_chains, "jump_rules": ipt_jumps},
        "nftables_mode": {
            "tables": [
                {
                    "family": f.obj.family,
                    "table": f.obj.name,
                    "chains": f.obj.chains,
                    "sets": {s.name: s.elements for s in f.obj.sets},
                }
                for f in c.of(NftTable, Owner.NFTABLES_MODE)
            ]
        },
        "stale": c.stale,
        "sysctls": dict(snap.kernel.data.sysctls),
        "sysctl_notes": [
            {"name": n.name, "value": n.value, "set_by_ipvs_mode": n.by_ipvs_mode, "note": n.note}
            for n in attribute(snap.kernel.data, snap.kube_proxy.configz.data)
        ],
        "kube_proxy": _kube_proxy(snap),
        "findings": [
            {
                "class": f.owner.value,
                "source": f.source,
                "kind": f.kind,
                "name": f.name,
                "evidence": list(f.evidence),
            }
            for f in c.findings
        ],
    }


def _kube_proxy(snap: Snapshot) -> dict[str, Any]:
    """Upstream's signals and /configz's settings, as read (docs/audit-json.md)."""
    kp = snap.kube_proxy
    gate = kp.metrics.data.ipvs_feature_gate if kp.metrics.data else None
    z = kp.configz.data
    return {
        "ipvs_feature_gate": {"value": gate[0], "stage": gate[1]} if gate else None,
        "ipvs_feature_gate_note": ipvs_feature_gate(kp),
        "configz": {"status": kp.configz.status, "error": kp.configz.error}
        | (
            {
                "mode": z.mode,
                "node_port_addresses": list(z.node_port_addresses),
                "strict_arp": z.strict_arp,
                "iptables_masquerade_bit": z.iptables_masquerade_bit,
                "nftables_masquerade_bit": z.nftables_masquerade_bit,
            }
            if z
            else {}
        ),
    }


def exit_code(snap: Snapshot, c: Classification) -> int:
    """docs/exit-codes.md: 4 when a source failed, else 1 for objects not confirmed in use by
    ipvs mode."""
    if any(r.status == "error" for r in snap.sources().values()):
        return exitcodes.ERROR
    if c.leftovers and c.mode.detected != "ipvs":
        return exitcodes.REMAINS
    if c.iptables_leftovers and c.mode.detected != "iptables":
        return exitcodes.REMAINS
    return exitcodes.OK


def verdict(snap: Snapshot, c: Classification) -> str:
    errors = [n for n, r in snap.sources().items() if r.status == "error"]
    n = len(c.leftovers)
    if errors:
        return f"INCOMPLETE: could not read {', '.join(errors)}; see the errors above"
    return _ipvs_verdict(c, n) + _iptables_mode_note(c)


def _ipvs_verdict(c: Classification, n: int) -> str:
    if not n:
        if c.iptables_leftovers and c.mode.detected != "iptables":
            return f"LEFTOVERS: no ipvs-mode objects; kube-proxy mode {c.mode.detected}"
        return "CLEAN: no ipvs-mode objects on this node"
    if c.mode.detected == "ipvs":
        return f"IN USE: {n} ipvs-mode objects, and kube-proxy runs ipvs mode"
    if c.stale:
        return f"STALE: {n} ipvs-mode leftovers while kube-proxy runs nftables mode (confirmed)"
    return f"LEFTOVERS: {n} ipvs-mode objects; kube-proxy mode {c.mode.detected}, not confirmed"


def _iptables_mode_note(c: Classification) -> str:
    """iptables mode's objects, said apart: in use under iptables mode, else left over."""
    m = len(c.iptables_leftovers)
    if not m:
        return ""
    if c.mode.detected == "iptables":
        return f"; {m} iptables-mode objects in use by iptables mode"
    return f"; {m} iptables-mode objects left over (cleanup removes them too)"


def _describe(f: AnyFinding) -> str:
    obj = f.obj
    if isinstance(obj, IpvsService):
        return f"{f.name} ({len(obj.dests)} real servers, {obj.scheduler})"
    if isinstance(obj, Ipset):
        return f"{f.name} {obj.type} ({obj.elements} entries, {obj.references} references)"
    if isinstance(obj, Link):
        return f"{f.name} {obj.kind} {'UP' if obj.up else 'DOWN'} ({len(obj.addresses)} addrs)"
    if isinstance(obj, ChainRef):
        return f"{f.name} ({len(obj.chain.rules)} rules)"
    return f.name


def _summary(doc: dict[str, Any]) -> list[str]:
    left, foreign, ipt = doc["leftovers"], doc["foreign"], doc["iptables_leftovers"]
    conns = doc["ipvs_connections"]
    link = left["kube_ipvs0"]
    link_text = (
        f"{link['kind']} {'UP' if link['up'] else 'DOWN'} with {link['addresses']['ipv4']} IPv4 "
        f"+ {link['addresses']['ipv6']} IPv6 addresses"
        if link["present"]
        else "absent"
    )
    return [
        "summary of ipvs-mode objects:",
        f"  IPVS: {left['ipvs_virtual_servers']} virtual servers, "
        f"{left['ipvs_real_servers']} real servers "
        f"(foreign: {foreign['ipvs_virtual_servers']} / {foreign['ipvs_real_servers']})",
        f"  IPVS connections: {conns['leftovers']['active']} active, "
        f"{conns['leftovers']['inactive']} inactive (foreign: "
        f"{conns['foreign']['active']} / {conns['foreign']['inactive']})",
        f"  kube-ipvs0: {link_text}",
        f"  ipsets: {left['ipsets']['ipv4']} IPv4 + {left['ipsets']['ipv6']} IPv6 sets, "
        f"{left['ipset_entries']['ipv4']} + {left['ipset_entries']['ipv6']} entries",
        f"  iptables: {len(left['iptables_chains'])} chains with "
        f"{sum(ch['rules'] for ch in left['iptables_chains'])} rules, "
        f"{left['iptables_jump_rules']} jump rules",
        "summary of iptables-mode objects (a node that also ran iptables mode):",
        f"  iptables: {len(ipt['chains'])} chains with "
        f"{sum(ch['rules'] for ch in ipt['chains'])} rules, {ipt['jump_rules']} jump rules",
    ]


def render(snap: Snapshot, c: Classification, verbose: bool = False) -> str:
    """The human report: grouped by class, then source; the verdict last."""
    lines = [f"ipvs-leftovers {__version__} audit, kernel {snap.kernel.data.release}"]
    lines.append(
        f"kube-proxy mode: {c.mode.detected}; nftables mode confirmed: "
        f"{'yes' if c.mode.nftables_confirmed else 'no'}"
    )
    lines += [f"  - {e}" for e in c.mode.evidence]
    lines += [f"  - not confirmed: {e}" for e in c.mode.failed]
    lines.append(f"  - {ipvs_feature_gate(snap.kube_proxy)}")
    lines.append("sources:")
    for name, r in snap.sources().items():
        lines.append(f"  {name:20} {r.status}{': ' + r.error if r.error else ''}")
    lines += _summary(document(snap, c))
    for owner in Owner:
        found = [f for f in c.findings if f.owner is owner]
        if not found:
            continue
        lines.append(f"{owner.value} ({len(found)}):")
        for source in sorted({f.source for f in found}):
            group = [f for f in found if f.source == source]
            lines.append(f"  {source} ({len(group)}):")
            shown = group if verbose else group[:LIST_LIMIT]
            for f in shown:
                lines.append(f"    {_describe(f)}  <- {'; '.join(f.evidence)}")
            if len(shown) < len(group):
                lines.append(f"    ... {len(group) - len(shown)} more (--verbose lists all)")
    notes = attribute(snap.kernel.data, snap.kube_proxy.configz.data)
    if notes:
        lines.append("sysctls (never changed by audit):")
        lines += [f"  {n.name} = {n.value}: {n.note}" for n in notes if n.by_ipvs_mode]
        rest = [f"{n.name}={n.value}" for n in notes if not n.by_ipvs_mode]
        if rest:
            lines.append(f"  not as ipvs mode set them: {', '.join(rest)}")
    lines.append(verdict(snap, c))
    return "\n".join(lines)
