"""Every line of a verified bundle parsed and checked before restore changes anything.

Restore re-creates only what an ipvs-mode (or iptables-mode) kube-proxy could have made, and
only what this bundle's cleanup removed: each file is checked against the classifier's
ownership rules and against plan.json's record of what each step removed, and the iptables
rules against the table dump taken with the backup. Anything else raises BundleError, naming
the file and line, and nothing is changed (docs/bundle.md).
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections import Counter
from dataclasses import dataclass

from agent import names
from agent.classify import KUBE_PROXY_CLASSES, Owner, chain_owner, classify_ipset, classify_rule
from agent.cleanup import ipvsadm_rules
from agent.cleanup.bundle import BundleError
from agent.cleanup.link_check import LinkRestore, check_link, real_server_ips, service_ips
from agent.readers import iptables_save
from agent.snapshot import (
    BUILTIN_CHAINS,
    Backend,
    Family,
    Ipset,
    IptTable,
    IpVersion,
    as_backend,
    as_family,
)

BACKENDS = ("legacy", "nft")
FAMILIES = ("ipv4", "ipv6")
TABLES = frozenset({"filter", "nat", "mangle", "raw"})
# The targets kube-proxy's rules use besides its own chains (both modes, every release).
STANDARD_TARGETS = frozenset(
    {"ACCEPT", "DROP", "RETURN", "REJECT", "MARK", "MASQUERADE", "DNAT", "SNAT", "CONNMARK"}
)
ACTIONS = frozenset(
    {"delete-ipvs-service", "delete-link", "iptables-table", "destroy-ipset", "reset-sysctl"}
)
_CHAIN_DECL = re.compile(r":(\S+) - \[0:0\]")
_SYSCTL_NAME = re.compile(r"[a-z0-9_]+(\.[a-z0-9_]+)+")
_SET_MEMBER = re.compile(r"[0-9A-Za-z.:,/\[\]-]+")
_HEX = re.compile(r"0x[0-9a-fA-F]{1,8}")
_FORBIDDEN = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True)
class SetRestore:
    name: str
    lines: tuple[str, ...]  # its create line, then its add lines


@dataclass(frozen=True)
class TableRestore:
    backend: Backend
    family: Family
    table: str
    chains: tuple[tuple[str, tuple[str, ...]], ...]  # name, its rules (text after -A NAME)
    jumps: tuple[tuple[str, int, str], ...]  # built-in chain, old 1-based position, rule text


@dataclass(frozen=True)
class IpvsRestore:
    key: str  # `-t 10.96.0.1:443`, as ipvsadm -S -n writes it
    lines: tuple[str, ...]  # its -A line, then its -a lines


@dataclass(frozen=True)
class RestorePlan:
    sets: tuple[SetRestore, ...]
    link: LinkRestore | None
    tables: tuple[TableRestore, ...]
    services: tuple[IpvsRestore, ...]
    sysctls: tuple[tuple[str, str], ...]

    @property
    def empty(self) -> bool:
        return not (self.sets or self.link or self.tables or self.services or self.sysctls)


def _text(files: dict[str, bytes], name: str) -> str:
    try:
        text = files[name].decode()
    except UnicodeDecodeError as exc:
        raise BundleError(f"{name} is not UTF-8 text") from exc
    m = _FORBIDDEN.search(text)
    if m:
        line = text.count("\n", 0, m.start()) + 1
        raise BundleError(f"{name} line {line}: control character {m.group()!r}")
    return text


def _json(files: dict[str, bytes], name: str) -> object:
    try:
        return json.loads(_text(files, name))
    except ValueError as exc:
        raise BundleError(f"{name} is not valid JSON ({exc})") from exc


# --- plan.json: what each step removed ---------------------------------------------------------


@dataclass(frozen=True)
class Removed:
    services: frozenset[str]
    sets: frozenset[str]
    link: str | None
    link_addresses: frozenset[str] | None  # the IPs on kube-ipvs0; None: not recorded (older)
    tables: dict[tuple[str, str, str], tuple[frozenset[str], Counter[tuple[str, str]]]]
    sysctls: dict[str, str]  # name -> its value before cleanup


def _removed(doc: object) -> Removed:
    if not isinstance(doc, dict) or not isinstance(doc.get("steps"), list):
        raise BundleError("plan.json has no list of steps")
    services: set[str] = set()
    sets: set[str] = set()
    links: list[str] = []
    link_addresses: frozenset[str] | None = None
    tables: dict[tuple[str, str, str], tuple[frozenset[str], Counter[tuple[str, str]]]] = {}
    sysctls: dict[str, str] = {}
    for i, step in enumerate(doc["steps"], 1):
        removes = step.get("removes") if isinstance(step, dict) else None
        action = step.get("action") if isinstance(step, dict) else None
        if action not in ACTIONS or not isinstance(removes, dict):
            raise BundleError(f"plan.json step {i}: not a step cleanup writes")
        try:
            if action == "delete-ipvs-service":
                services.add(str(removes["ipvs_service"]))
            elif action == "destroy-ipset":
                sets.add(str(removes["ipset"]))
            elif action == "delete-link":
                links.append(str(removes["link"]))
                link_addresses = _link_addresses(removes.get("addresses"), i)
            elif action == "reset-sysctl":
                sysctls[str(removes["sysctl"])] = str(removes["from"])
            else:
                parts = tuple(str(step["target"]).split("/"))
                if len(parts) != 3:
                    raise BundleError(f"plan.json step {i}: target {step['target']!r}")
                jumps = Counter((str(c), str(t)) for c, t in removes["jumps"])
                tables[(parts[0], parts[1], parts[2])] = (
                    frozenset(str(c) for c in removes["chains"]),
                    jumps,
                )
        except (KeyError, TypeError, ValueError) as exc:
            raise BundleError(f"plan.json step {i}: malformed 'removes' ({exc})") from exc
    if len(links) > 1:
        raise BundleError("plan.json removes more than one link")
    return Removed(
        frozenset(services),
        frozenset(sets),
        links[0] if links else None,
        link_addresses,
        tables,
        sysctls,
    )


def _link_addresses(recorded: object, i: int) -> frozenset[str] | None:
    """The IPs a delete-link step records (`10.96.0.1/32` each); None for a bundle of an
    agent that did not record them."""
    if recorded is None:
        return None
    if not isinstance(recorded, list) or not all(isinstance(a, str) for a in recorded):
        raise BundleError(f"plan.json step {i}: 'addresses' is not a list of addresses")
    try:
        return frozenset(str(ipaddress.ip_interface(a).ip) for a in recorded)
    except ValueError as exc:
        raise BundleError(f"plan.json step {i}: {exc}") from exc


# --- ipset.save --------------------------------------------------------------------------------

_CREATE_VALUES = {
    "family": re.compile(r"inet6?"),
    "hashsize": re.compile(r"[0-9]{1,10}"),
    "maxelem": re.compile(r"[0-9]{1,10}"),
    "bucketsize": re.compile(r"[0-9]{1,3}"),
    "timeout": re.compile(r"[0-9]{1,10}"),
    "range": re.compile(r"[0-9]{1,5}-[0-9]{1,5}"),
    "initval": _HEX,
}
_CREATE_FLAGS = frozenset({"counters", "comment"})
_ADD_VALUES = {k: re.compile(r"[0-9]{1,20}") for k in ("timeout", "packets", "bytes")}


def _create(words: list[str], where: str) -> Ipset:
    name, kind, rest = words[1], words[2], words[3:]
    family: IpVersion | None = None
    i = 0
    while i < len(rest):
        word = rest[i]
        if word in _CREATE_FLAGS:
            i += 1
            continue
        pattern = _CREATE_VALUES.get(word)
        if pattern is None or i + 1 >= len(rest) or not pattern.fullmatch(rest[i + 1]):
            raise BundleError(f"{where}: create option {word!r} is not one ipset save writes")
        if word == "family":
            family = 6 if rest[i + 1] == "inet6" else 4
        i += 2
    finding = classify_ipset(Ipset(name, kind, family, 0, 0))
    if finding.owner is not Owner.IPVS_LEFTOVER:
        raise BundleError(
            f"{where}: {name} ({kind}) is not a kube-proxy set: {finding.evidence[0]}"
        )
    return Ipset(name, kind, family, 0, 0)


def _add(line: str, words: list[str], where: str) -> None:
    member, rest = words[2], words[3:]
    if not _SET_MEMBER.fullmatch(member):
        raise BundleError(f"{where}: member {member!r} is not an ipset member")
    i = 0
    while i < len(rest):
        word = rest[i]
        if word == "comment":  # a quoted comment, always last
            quoted = line.split(" comment ", 1)[-1]
            if not (
                len(quoted) >= 2 and quoted[0] == quoted[-1] == '"' and '"' not in quoted[1:-1]
            ):
                raise BundleError(f"{where}: malformed member comment")
            return
        pattern = _ADD_VALUES.get(word)
        if pattern is None or i + 1 >= len(rest) or not pattern.fullmatch(rest[i + 1]):
            raise BundleError(f"{where}: member option {word!r} is not one ipset save writes")
        i += 2


def check_ipsets(text: str, removed: Removed) -> tuple[SetRestore, ...]:
    lines: dict[str, list[str]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        where = f"ipset.save line {n}"
        if not line.strip():
            continue
        words = line.split()
        if words[0] == "create" and len(words) >= 3:
            if words[1] in lines:
                raise BundleError(f"{where}: {words[1]} is created twice")
            _create(words, where)
            lines[words[1]] = [line]
        elif words[0] == "add" and len(words) >= 3:
            if words[1] not in lines:
                raise BundleError(f"{where}: adds to {words[1]}, which this file does not create")
            _add(line, words, where)
            lines[words[1]].append(line)
        else:
            raise BundleError(f"{where}: only `create` and `add` lines may be restored")
    if set(lines) != removed.sets:
        raise BundleError(
            "ipset.save does not hold exactly the sets plan.json says cleanup destroyed"
        )
    return tuple(SetRestore(name, tuple(body)) for name, body in lines.items())


# --- iptables-<backend>-<family>.restore -------------------------------------------------------


def _kube_proxy_chain(table: str, chain: str) -> bool:
    return chain_owner(table, chain)[0] in KUBE_PROXY_CLASSES


def _saved(
    files: dict[str, bytes], stem: str, backend: Backend, family: Family
) -> dict[str, IptTable]:
    try:
        tables = iptables_save.parse(_text(files, f"{stem}.save"), backend, family)
    except iptables_save.IptablesSaveError as exc:
        raise BundleError(f"{stem}.save: {exc}") from exc
    return {t.name: t for t in tables}


class _Block:
    def __init__(self, table: str) -> None:
        self.table = table
        self.chains: dict[str, list[str]] = {}
        self.jumps: list[tuple[str, int, str]] = []


def _rule(block: _Block, chain: str, text: str, where: str) -> None:
    try:
        rule = iptables_save.checked_rule(("-A", chain), text)
    except iptables_save.IptablesSaveError as exc:
        raise BundleError(f"{where}: {exc}") from exc
    target = rule.target
    if (
        target is not None
        and target not in STANDARD_TARGETS
        and target not in block.chains
        and chain_owner(block.table, target)[0] is Owner.FOREIGN
    ):
        raise BundleError(f"{where}: target {target} is no Kubernetes chain nor a standard one")


def _jump(block: _Block, backend: Backend, family: Family, words: list[str], where: str) -> None:
    chain, pos, text = words[1], words[2], words[3] if len(words) > 3 else ""
    if chain not in BUILTIN_CHAINS or not pos.isdigit() or not 0 < int(pos) < 100_000:
        raise BundleError(f"{where}: -I only into a built-in chain at a position")
    try:
        rule = iptables_save.checked_rule(("-I", chain, pos), text)
    except iptables_save.IptablesSaveError as exc:
        raise BundleError(f"{where}: {exc}") from exc
    # A bundle line stands alone: the chain it jumps to is judged by its name.
    finding = classify_rule(IptTable(backend, family, block.table, ()), rule, {})
    if finding is None or finding.owner not in KUBE_PROXY_CLASSES:
        why = finding.evidence[0] if finding else "it jumps into no kube-proxy chain"
        raise BundleError(f"{where}: not a kube-proxy jump ({why})")
    block.jumps.append((chain, int(pos), text))


def _blocks(text: str, name: str, backend: Backend, family: Family) -> list[_Block]:
    blocks: list[_Block] = []
    block: _Block | None = None
    for n, line in enumerate(text.splitlines(), 1):
        where = f"{name} line {n}"
        if not line.strip():
            continue
        if block is None:
            if not line.startswith("*") or line[1:] not in TABLES:
                raise BundleError(f"{where}: expected a table (*nat, *filter, ...)")
            block = _Block(line[1:])
            continue
        m = _CHAIN_DECL.fullmatch(line)
        words = line.split(" ", 3)
        if line == "COMMIT":
            blocks.append(block)
            block = None
        elif m:
            chain = m.group(1)
            if not _kube_proxy_chain(block.table, chain) or chain in block.chains:
                raise BundleError(f"{where}: {chain} is not a kube-proxy chain to re-create")
            block.chains[chain] = []
        elif words[0] == "-A" and len(words) >= 2:
            chain, _, rule = line[3:].partition(" ")
            if chain not in block.chains:
                raise BundleError(f"{where}: rules only into the chains this file re-creates")
            _rule(block, chain, rule, where)
            block.chains[chain].append(rule)
        elif words[0] == "-I" and len(words) >= 4:
            _jump(block, backend, family, words, where)
        else:
            raise BundleError(f"{where}: {line[:40]!r} is no chain, rule or kube-proxy jump")
    if block is not None:
        raise BundleError(f"{name}: table {block.table} has no COMMIT (truncated?)")
    return blocks


def _matches_dump(block: _Block, saved: dict[str, IptTable], name: str) -> None:
    """The rules are the ones the table held before cleanup, the jumps at their places."""
    dump = saved.get(block.table)
    chains = {c.name: [r.text for r in c.rules] for c in dump.chains} if dump else {}
    for chain, rules in block.chains.items():
        if chains.get(chain) != rules:
            raise BundleError(f"{name}: chain {chain} differs from the dump taken with the backup")
    for chain, pos, text in block.jumps:
        held = chains.get(chain, [])
        if pos > len(held) or held[pos - 1] != text:
            raise BundleError(
                f"{name}: jump {chain} {pos} is not in the dump taken with the backup"
            )


def check_iptables(files: dict[str, bytes], removed: Removed) -> tuple[TableRestore, ...]:
    out: list[TableRestore] = []
    seen: set[tuple[str, str, str]] = set()
    for name in sorted(files):
        if not name.endswith(".restore"):
            continue
        stem = name.removesuffix(".restore")
        parts = stem.split("-")
        if len(parts) != 3 or parts[0] != "iptables" or parts[1] not in BACKENDS:
            raise BundleError(f"{name} is no file cleanup writes")
        if parts[2] not in FAMILIES or f"{stem}.save" not in files:
            raise BundleError(f"{name} is no file cleanup writes, or its .save is missing")
        backend, family = as_backend(parts[1]), as_family(parts[2])
        saved = _saved(files, stem, backend, family)
        for block in _blocks(_text(files, name), name, backend, family):
            key = (backend, family, block.table)
            if key in seen or key not in removed.tables:
                raise BundleError(f"{name}: {'/'.join(key)} is not a table plan.json changed")
            chains, jumps = removed.tables[key]
            if set(block.chains) != chains or Counter((c, t) for c, _, t in block.jumps) != jumps:
                raise BundleError(f"{name}: {'/'.join(key)} differs from what plan.json removed")
            _matches_dump(block, saved, name)
            seen.add(key)
            out.append(
                TableRestore(
                    backend,
                    family,
                    block.table,
                    tuple((c, tuple(r)) for c, r in block.chains.items()),
                    tuple(block.jumps),
                )
            )
    if seen != set(removed.tables):
        raise BundleError("the bundle lacks the iptables files of tables plan.json changed")
    return tuple(out)


# --- ipvsadm.rules -----------------------------------------------------------------------------


def check_ipvs(text: str, removed: Removed) -> tuple[IpvsRestore, ...]:
    if ipvsadm_rules.parse(text) is None:
        raise BundleError(
            "ipvsadm.rules: only the -A and -a lines ipvsadm -S -n writes may be restored"
        )
    services: dict[str, list[str]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words:
            continue
        key = f"{words[1]} {words[2]}"
        if words[0] == "-A":
            if key in services:
                raise BundleError(f"ipvsadm.rules line {n}: {key} is added twice")
            services[key] = [line]
        elif key not in services:
            raise BundleError(f"ipvsadm.rules line {n}: a real server of no service added here")
        else:
            services[key].append(line)
    if set(services) != removed.services:
        raise BundleError(
            "ipvsadm.rules does not hold exactly the virtual servers plan.json says were deleted"
        )
    return tuple(IpvsRestore(k, tuple(v)) for k, v in services.items())


# --- sysctls.json ------------------------------------------------------------------------------


def check_sysctls(doc: object, removed: Removed) -> tuple[tuple[str, str], ...]:
    if not isinstance(doc, dict):
        raise BundleError("sysctls.json must map sysctl names to values")
    out = []
    for name, value in doc.items():
        if not _SYSCTL_NAME.fullmatch(name) or name not in names.ARP_SYSCTLS:
            raise BundleError(f"sysctls.json: {name!r} is not a sysctl cleanup may reset")
        if not isinstance(value, str) or removed.sysctls.get(name) != value:
            raise BundleError(f"sysctls.json: {name} is not what plan.json says it was")
        # cleanup resets a sysctl only from strictARP's value (agent.cleanup.plan): any other
        # value (arp_ignore=8 answers no ARP at all) is no bundle of cleanup's
        if value != names.ARP_SYSCTLS[name]:
            raise BundleError(
                f"sysctls.json: {name}={value} is not the strictARP value "
                f"{names.ARP_SYSCTLS[name]} cleanup resets from"
            )
        out.append((name, value))
    if {n for n, _ in out} != set(removed.sysctls):
        raise BundleError("sysctls.json does not hold exactly the sysctls plan.json reset")
    return tuple(out)


def check(files: dict[str, bytes]) -> RestorePlan:
    """The whole bundle, checked; raises BundleError before anything is changed."""
    known = {"plan.json", "ipset.save", "kube-ipvs0.json", "ipvsadm.rules", "sysctls.json"}
    for name in files:
        if name not in known and not re.fullmatch(r"iptables-[a-z]+-ipv[46]\.(save|restore)", name):
            raise BundleError(f"{name} is no file cleanup writes")
    if "plan.json" not in files:
        raise BundleError("the bundle has no plan.json")
    removed = _removed(_json(files, "plan.json"))
    sets = check_ipsets(_text(files, "ipset.save"), removed) if "ipset.save" in files else ()
    if not sets and removed.sets:
        raise BundleError("plan.json destroyed sets but the bundle has no ipset.save")
    link = None
    if "kube-ipvs0.json" in files:
        # a bundle that did not record the link's addresses: the deleted Service IPs
        recorded = removed.link_addresses
        if recorded is None:
            recorded = service_ips(removed.services)
        rules = _text(files, "ipvsadm.rules") if "ipvsadm.rules" in files else ""
        doc = _json(files, "kube-ipvs0.json")
        link = check_link(doc, removed.link, recorded, real_server_ips(rules))
    elif removed.link:
        raise BundleError("plan.json deleted kube-ipvs0 but the bundle has no kube-ipvs0.json")
    services: tuple[IpvsRestore, ...] = ()
    if "ipvsadm.rules" in files:
        services = check_ipvs(_text(files, "ipvsadm.rules"), removed)
    elif removed.services:
        raise BundleError("plan.json deleted virtual servers but the bundle has no ipvsadm.rules")
    sysctls: tuple[tuple[str, str], ...] = ()
    if "sysctls.json" in files:
        sysctls = check_sysctls(_json(files, "sysctls.json"), removed)
    elif removed.sysctls:
        raise BundleError("plan.json reset sysctls but the bundle has no sysctls.json")
    return RestorePlan(sets, link, check_iptables(files, removed), services, sysctls)
