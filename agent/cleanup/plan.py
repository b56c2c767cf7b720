"""The cleanup plan (docs/contract.md#cleanup): a pure function of a classified snapshot.

Ownership was decided by the classifier; here only references are followed, so that an
ipvs-mode object still referenced by state that is not being removed is kept untouched (not even
flushed), and the steps are put in the order of docs/contract.md#cleanup.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from agent import names
from agent.findings import KUBE_PROXY_CLASSES, ChainRef, Classification, Owner, Reference, RuleRef
from agent.snapshot import (
    Family,
    Ipset,
    IptRule,
    IptTable,
    IpvsService,
    Link,
    NftFamily,
    Snapshot,
)

ARP_DEFAULTS = {"net.ipv4.conf.all.arp_ignore": "0", "net.ipv4.conf.all.arp_announce": "0"}

TableKey = tuple[str, str, str]  # backend, family, table


@dataclass(frozen=True)
class TableChange:
    """One atomic iptables-restore transaction: jumps out, each chain's rules deleted by their
    text (`-D`, so the kernel refuses a rule that is not there), chains deleted (`-X`)."""

    backend: str
    family: str
    table: str
    delete_rules: tuple[IptRule, ...]
    chains: tuple[str, ...]
    # for the backup: each deleted built-in rule with its 1-based position before cleanup
    positions: tuple[int, ...] = ()
    chain_rules: tuple[tuple[str, tuple[IptRule, ...]], ...] = ()

    def restore_text(self) -> str:
        """Each backed-up rule deleted by its text, then each chain: never `-F`, so the kernel
        itself refuses the transaction when the node no longer holds exactly the backup (a
        rule gone fails its `-D`; a rule added since keeps its chain non-empty and fails the
        `-X`), and nothing the bundle lacks is ever removed. Deleting from the head of each
        chain keeps every `-D` a match at the first rule."""
        lines = [f"*{self.table}"]
        lines += [f"-D {r.chain} {r.text}" for r in self.delete_rules]
        by_chain = dict(self.chain_rules)
        lines += [f"-D {c} {r.text}" for c in self.chains for r in by_chain.get(c, ())]
        lines += [f"-X {c}" for c in self.chains]
        lines.append("COMMIT")
        return "\n".join(lines) + "\n"


# What a step does; its phase is the order of docs/contract.md#cleanup (upstream's): 1 IPVS,
# 2 the link, 3 iptables, 4 ipsets, 5 sysctls.
Action = Literal[
    "delete-ipvs-service", "delete-link", "iptables-table", "destroy-ipset", "reset-sysctl"
]


@dataclass(frozen=True)
class _Step:
    """What every step says: its object's name and the evidence it goes on."""

    target: str
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class DeleteService(_Step):
    """Delete one virtual server (never a flush)."""

    service: IpvsService
    phase: ClassVar[int] = 1
    action: ClassVar[Action] = "delete-ipvs-service"


@dataclass(frozen=True)
class DeleteLink(_Step):
    """Delete kube-ipvs0, if it is still a dummy."""

    link: Link
    phase: ClassVar[int] = 2
    action: ClassVar[Action] = "delete-link"


@dataclass(frozen=True)
class ChangeTable(_Step):
    """One table's jumps out, its chains emptied rule by rule and deleted, in one transaction."""

    table: TableChange
    phase: ClassVar[int] = 3
    action: ClassVar[Action] = "iptables-table"


@dataclass(frozen=True)
class DestroySet(_Step):
    """Destroy one ipset by name."""

    ipset: Ipset
    phase: ClassVar[int] = 4
    action: ClassVar[Action] = "destroy-ipset"


@dataclass(frozen=True)
class ResetSysctl(_Step):
    """Write a strictARP sysctl back to its default (only on request)."""

    sysctl: tuple[str, str, str]  # name, from, to
    phase: ClassVar[int] = 5
    action: ClassVar[Action] = "reset-sysctl"


Step = DeleteService | DeleteLink | ChangeTable | DestroySet | ResetSysctl


@dataclass(frozen=True)
class Kept:
    """What the cleanup leaves, and why."""

    kind: Literal["chain", "jump-rule", "ipset", "link", "sysctl"]
    name: str
    reason: str


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    kept: tuple[Kept, ...] = field(default=())

    @property
    def empty(self) -> bool:
        return not self.steps

    def contents(self) -> dict[str, str]:
        """What each step removes, in content, and what is kept, from this reading: one
        entry per chain (its rules), per table's jumps (rules and positions), per virtual
        server (its settings and how many real servers), per set (type, family, members
        counted), for the link (index, kind and state, then its addresses), per sysctl and
        kept object. Equal for two reads of an unchanged node; the re-check names the first
        entry that differs. Nothing here reads the kernel: the real servers and the members
        themselves are compared with the bundle (agent.cleanup.recheck)."""
        out: dict[str, str] = {}
        for s in self.steps:
            if isinstance(s, ChangeTable):
                t = s.table
                where = f"{t.backend}/{t.family}/{t.table}"
                jumps = zip(t.positions or (0,) * len(t.delete_rules), t.delete_rules, strict=True)
                out[f"jump rules in {where}"] = "\n".join(
                    f"{pos} -A {r.chain} {r.text}" for pos, r in jumps
                )
                for name in t.chains:
                    out[f"chain {where} {name}"] = ""
                for name, rules in t.chain_rules:
                    out[f"chain {where} {name}"] = "\n".join(r.text for r in rules)
            elif isinstance(s, DeleteService):
                v = s.service
                out[f"virtual server {v.key}"] = (
                    f"{v.scheduler} flags {v.flags:#x} timeout {v.timeout} netmask {v.netmask} "
                    f"pe {v.pe_name or '-'}; {len(v.dests)} real servers"
                )
            elif isinstance(s, DestroySet):
                i = s.ipset
                out[f"set {i.name}"] = f"{i.type} family {i.family}; {i.elements} members"
            elif isinstance(s, DeleteLink):
                ln = s.link
                head = f"index {ln.index} kind {ln.kind} {'up' if ln.up else 'down'}"
                out[f"link {ln.name}"] = "\n".join((head, *sorted(ln.addresses)))
            else:
                out[f"{s.action} {s.target}"] = repr(s.sysctl)
        for k in self.kept:
            out[f"kept {k.kind} {k.name}"] = ""
        return out

    def kept_reasons(self) -> dict[tuple[str, str], str]:
        """Why each kept object stays, by (kind, name): what verify is handed, so that a view
        never builds a plan itself."""
        return {(k.kind, k.name): k.reason for k in self.kept}


def _key(t: IptTable) -> TableKey:
    return (t.backend, t.family, t.name)


def _referencing(
    tables: list[IptTable],
    references: tuple[Reference, ...],
    leftover_chains: dict[TableKey, set[str]],
    leftover_sets: set[str],
    deletable_jumps: set[tuple[TableKey, str, str]],
    nft_marks: dict[NftFamily | int, int | None],
) -> tuple[dict[tuple[TableKey, str], str], dict[str, str]]:
    """Chains and sets that state not being removed still references, with the reason: from
    the classifier's references (every rule naming a KUBE-* chain or set; kube-proxy's chains
    and sets all have such names)."""
    kept_chains: dict[tuple[TableKey, str], str] = {}
    kept_sets: dict[str, str] = {}
    edges: dict[tuple[TableKey, str], list[IptRule]] = defaultdict(list)
    for ref in references:
        table, rule = _key(ref.table), ref.rule
        mine = leftover_chains.get(table, set())
        if ref.chain in mine:
            edges[(table, ref.chain)].append(rule)
            continue
        if (table, ref.chain, rule.text) in deletable_jumps:
            continue
        where = f"{'/'.join(table)} -A {ref.chain} {rule.text}"
        if rule.target in mine:
            kept_chains.setdefault((table, rule.target), f"referenced by {where}")
        for s in rule.match_sets:
            if s in leftover_sets:
                kept_sets.setdefault(s, f"referenced by {where}")
    # A kept chain keeps its rules, so whatever they reference is kept as well; a kept
    # KUBE-MARK-MASQ may keep KUBE-POSTROUTING, whose rules then keep what they reference.
    todo = list(kept_chains)
    while todo:
        while todo:
            key = todo.pop()
            for rule in edges.get(key, ()):
                why = f"referenced by kept chain {key[1]}: -A {key[1]} {rule.text}"
                target = (key[0], rule.target or "")
                if rule.target in leftover_chains.get(key[0], set()) and target not in kept_chains:
                    kept_chains[target] = why
                    todo.append(target)
                for s in rule.match_sets:
                    if s in leftover_sets:
                        kept_sets.setdefault(s, why)
        masquerade = _masquerade_kept(tables, leftover_chains, kept_chains, nft_marks)
        kept_chains.update(masquerade)
        todo = list(masquerade)
    return kept_chains, kept_sets


_MARK = re.compile(r"-j MARK (?:--set-xmark|--or-mark) (0x[0-9a-fA-F]+)")
_NFT_FAMILY: dict[Family, NftFamily] = {"ipv4": "ip", "ipv6": "ip6"}


MASQ, POSTROUTING = names.MARK_MASQ_CHAIN, names.POSTROUTING_CHAIN


def _masquerade_kept(
    tables: list[IptTable],
    leftover_chains: dict[TableKey, set[str]],
    kept_chains: dict[tuple[TableKey, str], str],
    nft_marks: dict[NftFamily | int, int | None],
) -> dict[tuple[TableKey, str], str]:
    """KUBE-POSTROUTING kept beside a kept KUBE-MARK-MASQ (docs/contract.md#cleanup).

    A foreign rule that still jumps to KUBE-MARK-MASQ expects its packets masqueraded; with
    KUBE-POSTROUTING gone that only holds if nftables mode masquerades the same mark bit.
    """
    out: dict[tuple[TableKey, str], str] = {}
    for t in tables:
        key = _key(t)
        if t.name != "nat" or not {MASQ, POSTROUTING} <= leftover_chains.get(key, set()):
            continue
        if (key, MASQ) not in kept_chains or (key, POSTROUTING) in kept_chains:
            continue
        marks = [
            int(m.group(1), 16)
            for ch in t.chains
            if ch.name == MASQ
            for r in ch.rules
            if (m := _MARK.search(r.text))
        ]
        nft_family = _NFT_FAMILY[t.family]
        honoured = nft_marks.get(nft_family)
        if len(marks) == 1 and honoured == marks[0]:
            continue
        shown = f"{honoured:#x}" if honoured is not None else "no mark"
        out[(key, POSTROUTING)] = (
            f"it masquerades what {MASQ} marks, which is kept "
            f"({kept_chains[(key, MASQ)]}); nftables mode ({nft_family} {names.NFTABLES_TABLE}) "
            f"masquerades {shown}, not {MASQ}'s "
            f"{', '.join(f'{m:#x}' for m in marks) or 'unknown mark'}"
        )
    return out


def _services_on(link: Link, c: Classification) -> list[str]:
    """Virtual servers that stay and whose address is on `link`.

    Deleting the link would take their address off the node and break them, so it is kept
    while any of them remains (an owned one kept, or one only weakly attributed).
    """
    bound = {a.split("/", 1)[0] for a in link.addresses}
    return [
        f.name
        for f in c.of(IpvsService)
        if f.owner is not Owner.IPVS_LEFTOVER
        and f.obj.address is not None
        and f.obj.address in bound
    ]


def _table_step(
    t: IptTable,
    leftover_chains: dict[TableKey, set[str]],
    kept_chains: dict[tuple[TableKey, str], str],
    deletable: set[tuple[TableKey, str, str]],
    mode_of: dict[tuple[TableKey, str], str],
    kept: list[Kept],
) -> ChangeTable | None:
    """One table's transaction: kube-proxy's jumps out, its chains emptied rule by rule and
    deleted, save what is kept (added to `kept`, with why); None when nothing in it goes."""
    key = _key(t)
    chains = [
        ch
        for ch in t.chains
        if ch.name in leftover_chains.get(key, set()) and (key, ch.name) not in kept_chains
    ]
    for ch in t.chains:
        if (key, ch.name) in kept_chains:
            kept.append(Kept("chain", f"{'/'.join(key)} {ch.name}", kept_chains[(key, ch.name)]))
    rules: list[IptRule] = []
    positions: list[int] = []
    for ch in t.chains:
        for pos, rule in enumerate(ch.rules, 1):
            if (key, ch.name, rule.text) not in deletable:
                continue
            if (key, rule.target) in kept_chains:
                kept.append(
                    Kept(
                        "jump-rule",
                        f"{'/'.join(key)} {ch.name} -> {rule.target}",
                        f"its target {rule.target} is kept",
                    )
                )
                continue
            rules.append(rule)
            positions.append(pos)
    if not chains and not rules:
        return None
    change = TableChange(
        t.backend,
        t.family,
        t.name,
        tuple(rules),
        tuple(ch.name for ch in chains),
        tuple(positions),
        tuple((ch.name, ch.rules) for ch in chains),
    )
    evidence = [
        f"{len(rules)} kube-proxy jump rules",
        *(
            f"chain {ch.name} ({len(ch.rules)} rules): {mode_of[(key, ch.name)]} chain"
            for ch in chains
        ),
    ]
    return ChangeTable("/".join(key), tuple(evidence), change)


def _sysctl_steps(
    sysctls: dict[str, str], reset: bool, steps: list[Step], kept: list[Kept]
) -> None:
    """strictARP's values: reset on request, else kept and said so."""
    for name, strict in names.ARP_SYSCTLS.items():
        if sysctls.get(name) == strict:
            if reset:
                steps.append(
                    ResetSysctl(name, ("strictARP value",), (name, strict, ARP_DEFAULTS[name]))
                )
            else:
                kept.append(
                    Kept(
                        "sysctl",
                        f"{name}={strict}",
                        "strictARP value; changed only with --reset-arp-sysctls",
                    )
                )


def make_plan(snap: Snapshot, c: Classification, reset_arp_sysctls: bool = False) -> Plan:
    steps: list[Step] = []
    kept: list[Kept] = []
    for svc in c.of(IpvsService, Owner.IPVS_LEFTOVER):
        steps.append(DeleteService(svc.name, svc.evidence, svc.obj))

    tables = list(snap.iptables_legacy.data) + list(snap.iptables_nft.data)
    # iptables mode's chains and jumps go in the same per-table step as ipvs mode's: to each
    # other they are kube-proxy's own references, never foreign ones (docs/contract.md#ownership).
    leftover_chains: dict[TableKey, set[str]] = defaultdict(set)
    mode_of: dict[tuple[TableKey, str], str] = {}
    for f in c.of(ChainRef, *KUBE_PROXY_CLASSES):
        leftover_chains[_key(f.obj.table)].add(f.obj.chain.name)
        mode = "ipvs-mode" if f.owner is Owner.IPVS_LEFTOVER else "iptables-mode"
        mode_of[(_key(f.obj.table), f.obj.chain.name)] = mode
    set_findings = c.of(Ipset, Owner.IPVS_LEFTOVER)
    leftover_sets = {f.name for f in set_findings}
    deletable = {
        (_key(j.obj.table), j.obj.rule.chain, j.obj.rule.text)
        for j in c.of(RuleRef, *KUBE_PROXY_CLASSES)
    }
    nft_marks = {
        t.family: t.masquerade_mark for t in snap.nftables.data if t.name == names.NFTABLES_TABLE
    }
    kept_chains, kept_sets = _referencing(
        tables, c.references, leftover_chains, leftover_sets, deletable, nft_marks
    )

    for t in tables:
        step = _table_step(t, leftover_chains, kept_chains, deletable, mode_of, kept)
        if step is not None:
            steps.append(step)

    for ipset in set_findings:
        if ipset.name in kept_sets:
            kept.append(Kept("ipset", ipset.name, kept_sets[ipset.name]))
        else:
            steps.append(DestroySet(ipset.name, ipset.evidence, ipset.obj))

    for link in c.of(Link, Owner.IPVS_LEFTOVER):
        users = _services_on(link.obj, c)
        if users:
            why = f"{len(users)} IPVS service(s) not removed use its addresses: "
            kept.append(Kept("link", link.name, why + ", ".join(users[:3])))
        else:
            steps.append(DeleteLink(link.name, link.evidence, link.obj))

    _sysctl_steps(snap.kernel.data.sysctls, reset_arp_sysctls, steps, kept)
    steps.sort(key=lambda s: s.phase)
    return Plan(tuple(steps), tuple(kept))


def describe(plan: Plan) -> list[str]:
    """Each step with its evidence (and a virtual server's live connections), then what is
    kept and why."""
    lines = []
    for i, s in enumerate(plan.steps, 1):
        lines.append(f"{i:3}. {s.action} {s.target}")
        lines += [f"       evidence: {e}" for e in s.evidence]
        if isinstance(s, DeleteService):
            v = s.service
            lines.append(
                f"       connections: {v.active_conns} active, {v.inactive_conns} inactive"
            )
    for k in plan.kept:
        lines.append(f"  keep {k.kind} {k.name}: {k.reason}")
    return lines
