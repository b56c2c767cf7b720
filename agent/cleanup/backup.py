"""The backup bundle written before the first change, in formats operators know
(docs/contract.md#cleanup).

One folder per run, written whole or not at all (agent.cleanup.bundle):
  manifest.json                  format, node, agent version, each file's SHA-256
  plan.json                      the plan, with evidence and what was kept
  ipvsadm.rules                  `ipvsadm -S -n` lines of the removed virtual servers
  ipset.save                     `ipset save` lines of the destroyed sets
                                 (both written from netlink readings, byte for byte as the
                                 tools print them; the tools run only as a fallback)
  iptables-<backend>-<family>.save     the whole table dump before cleanup, for reference
  iptables-<backend>-<family>.restore  `iptables-restore --noflush` input re-creating what was
                                       removed: chains, their rules, the jumps at their places
  kube-ipvs0.json                the link's kind, addresses and queue length
  sysctls.json                   sysctls changed, with their values before
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agent import __version__
from agent.cleanup import bundle, ipset_save, ipvsadm_save
from agent.cleanup.plan import (
    ChangeTable,
    DeleteLink,
    DeleteService,
    DestroySet,
    Plan,
    ResetSysctl,
    Step,
    TableChange,
)
from agent.readers import ipvs, tools
from agent.snapshot import IpvsService

SAVE_TOOL = {
    ("legacy", "ipv4"): "iptables-legacy",
    ("legacy", "ipv6"): "ip6tables-legacy",
    ("nft", "ipv4"): "iptables-nft",
    ("nft", "ipv6"): "ip6tables-nft",
}


def ipvsadm_key(svc: IpvsService) -> tuple[str, str]:
    host = f"[{svc.address}]" if svc.family == 6 else str(svc.address)
    return (ipvsadm_save.PROTOCOL_OPTIONS.get(svc.protocol, "-t"), f"{host}:{svc.port}")


def filter_ipvsadm_save(text: str, keys: set[tuple[str, str]]) -> str:
    """The lines of `ipvsadm -S -n` output that belong to the given services."""
    out = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] in ("-A", "-a") and (words[1], words[2]) in keys:
            out.append(line)
    return "\n".join(out) + ("\n" if out else "")


def filter_ipset_save(text: str, names: list[str]) -> str:
    """The `create` and `add` lines of `ipset save` output that belong to the given sets."""
    wanted = set(names)
    out = []
    for line in text.splitlines():
        words = line.split(None, 2)
        if len(words) >= 2 and words[0] in ("create", "add") and words[1] in wanted:
            out.append(line)
    return "\n".join(out) + ("\n" if out else "")


def iptables_restore_text(changes: list[TableChange]) -> str:
    """Re-creates removed chains with their rules, and the jumps at their old positions."""
    lines: list[str] = []
    for ch in changes:
        lines.append(f"*{ch.table}")
        lines += [f":{name} - [0:0]" for name in ch.chains]
        for name, rules in ch.chain_rules:
            lines += [f"-A {name} {r.text}" for r in rules]
        # Inserting in ascending order of the old positions puts each jump back where it was.
        for pos, rule in sorted(
            zip(ch.positions, ch.delete_rules, strict=True), key=lambda pr: (pr[1].chain, pr[0])
        ):
            lines.append(f"-I {rule.chain} {pos} {rule.text}")
        lines.append("COMMIT")
    return "\n".join(lines) + "\n"


def ipvsadm_rules(services: list[IpvsService], timeout: float = tools.DEFAULT_TIMEOUT) -> str:
    """`ipvsadm -S -n` lines of these services, from the reading the plan was made from;
    `ipvsadm -S -n` itself only for a shape agent.cleanup.ipvsadm_save has no rule for.

    The real servers come from one read of /proc/net/ip_vs: a netlink dump per virtual
    server was more than half of the backup at 5,000 Services in the VM. A service /proc
    cannot describe exactly (a tunnel, an ambiguous fwmark) is dumped over netlink."""
    with ipvs.RealServers() as dests_of:
        if all(ipvsadm_save.supported(s, dests_of) for s in services):
            return ipvsadm_save.save_text(services, dests_of)
    saved = tools.run(["ipvsadm", "-S", "-n"], timeout=timeout)
    return filter_ipvsadm_save(saved, {ipvsadm_key(s) for s in services})


def ipset_rules(names: list[str], timeout: float = tools.DEFAULT_TIMEOUT) -> str:
    """`ipset save` lines of these sets, listed over netlink; `ipset save` itself (one run
    for all: a process per set cost more than the dump) when a set has a shape
    agent.cleanup.ipset_save has no rule for."""
    saved = ipset_save.save(names)
    if not saved.unsupported:
        return saved.text
    return filter_ipset_save(tools.run(["ipset", "save"], timeout=timeout), names)


def _removes(s: Step) -> dict[str, Any]:
    """What a step removes, in the words restore checks each bundle file against."""
    if isinstance(s, DeleteService):
        option, where = ipvsadm_key(s.service)
        return {"ipvs_service": f"{option} {where}"}
    if isinstance(s, ChangeTable):
        t = s.table
        return {
            "chains": list(t.chains),
            "jumps": [[r.chain, r.text] for r in t.delete_rules],
        }
    if isinstance(s, DestroySet):
        return {"ipset": s.ipset.name}
    if isinstance(s, DeleteLink):  # the addresses: restore puts back no other (link_check)
        return {"link": s.link.name, "addresses": list(s.link.addresses)}
    name, before, after = s.sysctl
    return {"sysctl": name, "from": before, "to": after}


def _step(s: Step) -> dict[str, Any]:
    row: dict[str, Any] = {
        "phase": s.phase,
        "action": s.action,
        "target": s.target,
        "evidence": list(s.evidence),
        "removes": _removes(s),
    }
    if isinstance(s, DeleteService):  # as the plan's reading saw them (docs/bundle.md)
        row["connections"] = {
            "active": s.service.active_conns,
            "inactive": s.service.inactive_conns,
        }
    return row


def plan_document(plan: Plan, connections: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plan as plan.json holds it; `connections`: how the wait for them ended."""
    doc: dict[str, Any] = {
        "agent_version": __version__,
        "steps": [_step(s) for s in plan.steps],
        "kept": [{"kind": k.kind, "name": k.name, "reason": k.reason} for k in plan.kept],
    }
    if connections is not None:
        doc["connections"] = connections
    return doc


def plan_json(plan: Plan, connections: dict[str, Any] | None = None) -> str:
    """plan_document as JSON, one step per line: json's C encoder writes each line (indent=2
    runs the pure-Python encoder: 3.5 s of a 10,000-Service cleanup in the VM)."""
    doc = plan_document(plan, connections)
    parts = []
    for key, value in doc.items():
        if isinstance(value, list):
            rows = ",\n".join(f"    {json.dumps(v)}" for v in value)
            parts.append(f"  {json.dumps(key)}: [\n{rows}\n  ]" if value else f'  "{key}": []')
        else:
            parts.append(f"  {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def write_bundle(
    base: Path,
    plan: Plan,
    timeout: float = tools.DEFAULT_TIMEOUT,
    connections: dict[str, Any] | None = None,
) -> Path:
    """Write the bundle whole (agent.cleanup.bundle: a partial folder renamed into place with its
    manifest); raises OSError or tools.ToolError, before anything has changed, and then leaves
    no folder behind."""
    plan_text = plan_json(plan, connections)
    with bundle.writing(base, hashlib.sha256(plan_text.encode()).hexdigest()) as out:
        out.write("plan.json", plan_text)
        for name, text in _files(plan, timeout):
            out.write(name, text)
    if out.folder is None:  # writing() sets it whenever it returns normally
        raise OSError("the bundle was not completed")
    return out.folder


def _files(plan: Plan, timeout: float) -> Iterator[tuple[str, str]]:
    services = [s.service for s in plan.steps if isinstance(s, DeleteService)]
    if services:
        yield "ipvsadm.rules", ipvsadm_rules(services, timeout)

    sets = [s.ipset.name for s in plan.steps if isinstance(s, DestroySet)]
    if sets:
        yield "ipset.save", ipset_rules(sets, timeout)

    by_file: dict[tuple[str, str], list[TableChange]] = defaultdict(list)
    for s in plan.steps:
        if isinstance(s, ChangeTable):
            by_file[(s.table.backend, s.table.family)].append(s.table)
    for (backend, family), changes in by_file.items():
        stem = f"iptables-{backend}-{family}"
        yield f"{stem}.save", tools.run([f"{SAVE_TOOL[(backend, family)]}-save"], timeout=timeout)
        yield f"{stem}.restore", iptables_restore_text(changes)

    links = [s.link for s in plan.steps if isinstance(s, DeleteLink)]
    if links:
        link = links[0]
        doc = {
            "name": link.name,
            "index": link.index,
            "kind": link.kind,
            "up": link.up,
            "addresses": list(link.addresses),
        }
        if link.txqlen is not None:
            doc["txqlen"] = link.txqlen
        yield "kube-ipvs0.json", json.dumps(doc, indent=2) + "\n"

    sysctls = {s.sysctl[0]: s.sysctl[1] for s in plan.steps if isinstance(s, ResetSysctl)}
    if sysctls:
        yield "sysctls.json", json.dumps(sysctls, indent=2) + "\n"
