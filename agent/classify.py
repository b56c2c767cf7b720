"""The classifier: every object of a snapshot into exactly one owner class
(docs/contract.md#ownership).

Pure functions over plain data: no I/O, no clock (the caller passes `now`). This module is the
only place ownership is decided; the report, the metrics and the cleanup plan only read its
result (agent.findings: the vocabulary; agent.evidence: the IPVS evidence index; agent.gate:
the nftables-mode confirmation).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from agent import gate, names
from agent.evidence import Attribution, IpvsEvidence, evidence_sets_needed
from agent.findings import (
    KUBE_PROXY_CLASSES,
    AnyFinding,
    ChainRef,
    Classification,
    Finding,
    Kind,
    Owner,
    Reference,
    RuleRef,
)
from agent.snapshot import (
    Family,
    Ipset,
    IptChain,
    IptRule,
    IptTable,
    IpvsService,
    KubeProxyConfigz,
    Link,
    Links,
    NftTable,
    Snapshot,
)

# --- IPVS -----------------------------------------------------------------------------------


def classify_ipvs(
    services: Iterable[IpvsService],
    links: Links,
    sets: tuple[Ipset, ...],
    tables: tuple[NftTable, ...] = (),
    configz: KubeProxyConfigz | None = None,
) -> Iterator[Finding[IpvsService]]:
    index = IpvsEvidence.of(links, sets, tables, configz)
    for svc in services:
        why = index.of_service(svc)
        if why.strong:
            yield Finding(Owner.IPVS_LEFTOVER, "ipvs", "ipvs-service", svc.key, why.strong, svc)
        elif why.weak:
            evidence = (
                *why.weak,
                "no KUBE-* set names its address and port, nor does the running nftables mode "
                "serve it: weak evidence, never touched",
            )
            yield Finding(Owner.UNKNOWN_KUBE, "ipvs", "ipvs-service", svc.key, evidence, svc)
        else:
            evidence = ("no KUBE-* set member, NodePort or probe evidence",)
            yield Finding(Owner.FOREIGN, "ipvs", "ipvs-service", svc.key, evidence, svc)


# --- ipsets ---------------------------------------------------------------------------------


def classify_ipset(s: Ipset) -> Finding[Ipset]:
    known = names.IPVS_SETS.get(s.name)
    if known is not None:
        types, family, old = known
        family_ok = s.family in (None, family)
        if s.family == 6 and family == 4 and s.name in names.PLAIN_NAME_IPV6_OK:
            # an IPv6-only node of a release before the KUBE-6- prefix
            family, old, family_ok = 6, True, True
        if s.type in types and family_ok:
            why = f"kube-proxy ipvs-mode set {'of an older release ' if old else ''}"
            why += f"({s.type}, IPv{family})"
            return Finding(Owner.IPVS_LEFTOVER, "ipsets", "ipset", s.name, (why,), s)
        return Finding(
            Owner.UNKNOWN_KUBE,
            "ipsets",
            "ipset",
            s.name,
            (f"kube-proxy's name but type {s.type} family {s.family}, expected {types[0]}",),
            s,
        )
    if s.name.startswith(names.KUBE_PREFIX):
        return Finding(
            Owner.UNKNOWN_KUBE,
            "ipsets",
            "ipset",
            s.name,
            (f"{names.KUBE_PREFIX} name that no kube-proxy release uses",),
            s,
        )
    return Finding(Owner.FOREIGN, "ipsets", "ipset", s.name, ("not a kube-proxy name",), s)


def ipset_family(s: Ipset) -> Family:
    """ipv6 for KUBE-6- names and for the plain-named inet6 sets of older releases."""
    return "ipv6" if s.name.startswith(names.KUBE6_PREFIX) or s.family == 6 else "ipv4"


# --- iptables -------------------------------------------------------------------------------


def _iptables_mode_name(table: str, chain: str) -> bool:
    return chain in names.IPTABLES_MODE_CHAINS.get(table, ()) or chain.startswith(
        names.IPTABLES_MODE_PREFIXES.get(table, ("\0",))
    )


def _ipvs_mode_name(table: str, chain: str) -> bool:
    return chain in names.IPVS_CHAINS.get(table, ()) or chain in names.OLD_IPVS_CHAINS.get(
        table, ()
    )


def chain_owner(table: str, chain: str) -> tuple[Owner, str]:
    """Ownership of a (table, chain) pair by name; the backend and family never change it.

    A name both kube-proxy modes use in that table (nat KUBE-SERVICES, ...) is ipvs-leftover
    here; `classify_iptables` decides such a shared chain by its rules (`shared_chain_owner`).
    """
    if (table, chain) in names.KUBELET_CHAINS:
        return Owner.KUBELET, f"kubelet chain {table}/{chain}"
    if chain in names.IPVS_CHAINS.get(table, ()):
        return Owner.IPVS_LEFTOVER, f"kube-proxy ipvs-mode chain {table}/{chain}"
    if chain in names.OLD_IPVS_CHAINS.get(table, ()):
        return Owner.IPVS_LEFTOVER, f"chain {table}/{chain} of an older ipvs-mode release"
    if chain in names.AMBIGUOUS_CHAINS.get(table, ()):
        return (
            Owner.UNKNOWN_KUBE,
            f"{table}/{chain}: old kubelet, old ipvs or old iptables mode; never touched",
        )
    if _iptables_mode_name(table, chain):
        return Owner.IPTABLES_LEFTOVER, f"kube-proxy iptables-mode chain {table}/{chain}"
    if chain.startswith(names.KUBE_PREFIX):
        return Owner.UNKNOWN_KUBE, f"{table}/{chain} is no kube-proxy or kubelet chain"
    return Owner.FOREIGN, f"{table}/{chain} is not a Kubernetes chain"


def _is_shared(table: str, chain: str) -> bool:
    return chain in names.IPVS_CHAINS.get(table, ()) and chain in names.IPTABLES_MODE_CHAINS.get(
        table, ()
    )


_INVALID_DROP = names.IPTABLES_MODE_INVALID_DROP


def _mode_of_rules(table: str, chain: IptChain) -> Owner | None:
    """Which kube-proxy mode wrote `chain`'s rules, when they say so; None when both modes
    write the same rules (KUBE-MARK-MASQ, KUBE-POSTROUTING, ...) or the chain is empty.

    Each mode rewrites a whole chain on every sync (iptables-restore with the chain declared),
    so a shared chain holds the rules of the mode that synced it last.
    """
    ipvs = iptables = False
    for r in chain.rules:
        target = r.target or ""
        if any(s in names.IPVS_SETS for s in r.match_sets) or (
            _ipvs_mode_name(table, target) and not _is_shared(table, target)
        ):
            ipvs = True
        if (
            (_iptables_mode_name(table, target) and not _is_shared(table, target))
            or names.IPTABLES_MODE_FIREWALL_PREFIX in (r.comment or "")
            or (chain.name == _INVALID_DROP[0] and _INVALID_DROP[1] in r.text)
        ):
            iptables = True
    if ipvs:
        return Owner.IPVS_LEFTOVER
    return Owner.IPTABLES_LEFTOVER if iptables else None


def shared_chain_owner(t: IptTable, chain: IptChain) -> tuple[Owner, str]:
    """Owner of a chain name both modes use: its rules decide; rules both modes write decide
    nothing, and then the other kube-proxy chains of the same table do (any ipvs-mode one makes
    it ipvs-mode; iptables-mode ones alone make it iptables-mode). Either way it is a
    kube-proxy leftover, removed by the same cleanup."""
    where = f"{t.name}/{chain.name}"
    by_rules = _mode_of_rules(t.name, chain)
    if by_rules is Owner.IPVS_LEFTOVER:
        return by_rules, f"kube-proxy chain {where} holding ipvs-mode rules"
    if by_rules is Owner.IPTABLES_LEFTOVER:
        return by_rules, f"kube-proxy chain {where} holding iptables-mode rules"
    others = [c for c in t.chains if not c.builtin and c.name != chain.name]
    if any(
        (_ipvs_mode_name(t.name, c.name) and not _is_shared(t.name, c.name))
        or (_is_shared(t.name, c.name) and _mode_of_rules(t.name, c) is Owner.IPVS_LEFTOVER)
        for c in others
    ):
        return Owner.IPVS_LEFTOVER, f"kube-proxy ipvs-mode chain {where} (the table's mode)"
    if any(
        chain_owner(t.name, c.name)[0] is Owner.IPTABLES_LEFTOVER
        or (_is_shared(t.name, c.name) and _mode_of_rules(t.name, c) is Owner.IPTABLES_LEFTOVER)
        for c in others
    ):
        return Owner.IPTABLES_LEFTOVER, f"kube-proxy iptables-mode chain {where} (the table's mode)"
    return Owner.IPVS_LEFTOVER, f"kube-proxy ipvs-mode chain {where}"


def table_owners(t: IptTable) -> dict[str, tuple[Owner, str]]:
    """Owner and why of every non-built-in chain of one table."""
    return {
        c.name: (
            shared_chain_owner(t, c) if _is_shared(t.name, c.name) else chain_owner(t.name, c.name)
        )
        for c in t.chains
        if not c.builtin
    }


def _where(t: IptTable) -> str:
    return f"{t.backend}/{t.family}/{t.name}"


def classify_rule(
    t: IptTable, rule: IptRule, owners: dict[str, tuple[Owner, str]]
) -> Finding[RuleRef] | None:
    """A rule in a built-in chain that jumps into a Kubernetes chain; None for other rules.

    A jump kube-proxy writes (its comment, from that built-in chain to that target, in any
    release or mode) belongs to its target's class and goes with it."""
    if rule.target is None or not rule.target.startswith(names.KUBE_PREFIX):
        return None
    known = owners.get(rule.target)
    owner = known[0] if known else chain_owner(t.name, rule.target)[0]
    name = f"{_where(t)} {rule.chain} -> {rule.target}"
    source = f"iptables_{t.backend}"
    if owner in KUBE_PROXY_CLASSES:
        key = (t.name, rule.chain, rule.target)
        if rule.comment is not None and rule.comment in names.KUBE_PROXY_JUMPS.get(key, ()):
            mode = "ipvs-mode" if owner is Owner.IPVS_LEFTOVER else "iptables-mode"
            why = f"kube-proxy's jump into {mode} chain {rule.target}, comment {rule.comment!r}"
            return Finding(owner, source, "jump-rule", name, (why,), RuleRef(t, rule))
        # Someone else jumps into kube-proxy's chain: a foreign reference, never touched.
        return Finding(
            Owner.UNKNOWN_KUBE,
            source,
            "jump-rule",
            name,
            (
                f"jump into kube-proxy chain {rule.target} with a comment kube-proxy never "
                f"writes there ({rule.comment!r})",
            ),
            RuleRef(t, rule),
        )
    if owner is Owner.KUBELET:
        return Finding(
            Owner.KUBELET,
            source,
            "jump-rule",
            name,
            (f"jump into kubelet chain {rule.target}",),
            RuleRef(t, rule),
        )
    return Finding(
        Owner.UNKNOWN_KUBE,
        source,
        "jump-rule",
        name,
        (f"jump into {rule.target}, which is no kube-proxy chain",),
        RuleRef(t, rule),
    )


def _index(
    t: IptTable, kinds: dict[str, Owner], found: list[Reference]
) -> dict[str, list[IptRule]]:
    """One walk of a table's rules: each rule naming a KUBE-* chain or set goes into `found`;
    returned, the rules of its non-built-in chains by the chain they jump to."""
    by_target: dict[str, list[IptRule]] = {}
    for chain in t.chains:
        owner = None if chain.builtin else kinds.get(chain.name)
        for rule in chain.rules:
            target = rule.target
            if target is not None and not chain.builtin:
                by_target.setdefault(target, []).append(rule)
            if (target is not None and target.startswith(names.KUBE_PREFIX)) or any(
                s.startswith(names.KUBE_PREFIX) for s in rule.match_sets
            ):
                found.append(Reference(t, chain.name, owner, rule))
    return by_target


def classify_iptables(
    tables: Iterable[IptTable], references: list[Reference] | None = None
) -> Iterator[Finding[ChainRef] | Finding[RuleRef]]:
    """Every chain and every jump from a built-in chain into a Kubernetes chain; the rules that
    reference KUBE-* chains or sets are added to `references`."""
    found = [] if references is None else references
    for t in tables:
        owners = table_owners(t)
        kinds = {n: o for n, (o, _) in owners.items()}
        by_target = _index(t, kinds, found)
        for chain in t.chains:
            if chain.builtin:
                for rule in chain.rules:
                    jump = classify_rule(t, rule, owners)
                    if jump is not None:
                        yield jump
                continue
            owner, why = owners[chain.name]
            evidence = [why]
            refs = _referrers(chain.name, by_target.get(chain.name, []), kinds)
            evidence += [f"referenced by {r.chain}: {r.text}" for r in refs]
            yield Finding(
                owner,
                f"iptables_{t.backend}",
                "chain",
                f"{_where(t)} {chain.name}",
                tuple(evidence),
                ChainRef(t, chain),
            )


def _referrers(chain: str, jumps: list[IptRule], kinds: dict[str, Owner]) -> list[IptRule]:
    """Of the rules of non-built-in chains that jump into `chain`, those of another owner.

    kube-proxy's two modes are one owner here: an iptables-mode KUBE-SVC-* chain jumping to an
    ipvs-mode KUBE-MARK-MASQ is kube-proxy referencing itself, and both go."""

    def group(o: Owner | None) -> object:
        return KUBE_PROXY_CLASSES if o in KUBE_PROXY_CLASSES else o

    own = group(kinds.get(chain))
    return [r for r in jumps if group(kinds.get(r.chain)) != own]


# --- nftables and links ---------------------------------------------------------------------


def classify_nft_table(t: NftTable) -> Finding[NftTable] | None:
    key = (t.family, t.name)
    if key in names.IPTABLES_NFT_TABLES:
        return None  # iptables-nft's tables: their chains are classified as iptables chains
    if key in names.NFTABLES_MODE_TABLES:
        return Finding(
            Owner.NFTABLES_MODE,
            "nftables",
            "nft-table",
            f"{t.family} {t.name}",
            ("kube-proxy's nftables-mode table",),
            t,
        )
    return Finding(
        Owner.FOREIGN,
        "nftables",
        "nft-table",
        f"{t.family} {t.name}",
        ("not a kube-proxy table",),
        t,
    )


def classify_link(links: Links) -> Finding[Link] | None:
    link = links.kube_ipvs0
    if link is None:
        return None
    if link.kind == "dummy":
        return Finding(
            Owner.IPVS_LEFTOVER,
            "links",
            "link",
            link.name,
            (f"dummy link {link.name} with {len(link.addresses)} addresses",),
            link,
        )
    return Finding(
        Owner.UNKNOWN_KUBE,
        "links",
        "link",
        link.name,
        (f"{link.name} is of kind {link.kind}, not kube-proxy's dummy",),
        link,
    )


# --- the whole snapshot ---------------------------------------------------------------------


def classify(snap: Snapshot, now: float, max_sync_age: float = 0.0) -> Classification:
    findings: list[AnyFinding] = []
    findings += classify_ipvs(
        snap.ipvs.data,
        snap.links.data,
        snap.ipsets.data,
        snap.nftables.data,
        snap.kube_proxy.configz.data,
    )
    findings += (classify_ipset(s) for s in snap.ipsets.data)
    references: list[Reference] = []
    findings += classify_iptables(snap.iptables_legacy.data, references)
    findings += classify_iptables(snap.iptables_nft.data, references)
    findings += filter(None, (classify_nft_table(t) for t in snap.nftables.data))
    link = classify_link(snap.links.data)
    if link is not None:
        findings.append(link)
    leftovers = [f for f in findings if f.owner is Owner.IPVS_LEFTOVER]
    v6 = any(is_ipv6(f) for f in findings if f.owner in KUBE_PROXY_CLASSES)
    mode = gate.confirm(snap, now, max_sync_age, v6)
    return Classification(
        tuple(findings),
        mode,
        stale=mode.nftables_confirmed and bool(leftovers),
        references=tuple(references),
    )


def is_ipv6(f: AnyFinding) -> bool:
    """Whether a finding is of the IPv6 family, from the object it holds."""
    obj = f.obj
    if isinstance(obj, Ipset):
        return ipset_family(obj) == "ipv6"
    if isinstance(obj, IpvsService):
        return obj.family == 6
    if isinstance(obj, ChainRef | RuleRef):
        return obj.table.family == "ipv6"
    return False


__all__ = [
    "KUBE_PROXY_CLASSES",
    "AnyFinding",
    "Attribution",
    "ChainRef",
    "Classification",
    "Finding",
    "IpvsEvidence",
    "Kind",
    "Owner",
    "Reference",
    "RuleRef",
    "chain_owner",
    "classify",
    "classify_ipset",
    "classify_rule",
    "evidence_sets_needed",
    "ipset_family",
    "is_ipv6",
]
