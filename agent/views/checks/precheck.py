"""precheck (docs/precheck-verify.md): can this node move to nftables mode, and what will change.

Pure: kube-proxy's configuration and the node-IP hints are read by the caller
(agent/readers/kube_proxy_config.py, agent/cli/checks.py) and passed in. Something that could
not be read is a warn naming what, never a pass. The readiness gauges serve exports come from
the same checks (readiness_metrics).
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from agent import names
from agent.classify import (
    KUBE_PROXY_CLASSES,
    Classification,
    Owner,
    RuleRef,
    chain_owner,
)
from agent.readers.kube_proxy_config import KubeProxyConfig
from agent.snapshot import IptTable, IpvsService, Reading, Snapshot
from agent.views.checks.common import (
    Check,
    Status,
    _check,
    _listed,
)
from agent.views.checks.upstream import check_ipvs_deprecation
from agent.views.signals import DEFAULT_MODE_WARNING


@dataclass(frozen=True)
class NodeIpHints:
    """What says which node address is the primary one, strongest first."""

    explicit: tuple[str, ...] = ()  # --node-ip
    route_sources: dict[str, str] | None = None  # family -> default-route source address


def _family(address: str) -> str:
    return "ipv6" if ipaddress.ip_address(address).version == 6 else "ipv4"


def _bare(address: str) -> str:
    return str(ipaddress.ip_address(address.split("/")[0]))


def check_kernel(snap: Snapshot) -> Check:
    release = snap.kernel.data.release
    version = snap.kernel.data.version()
    need = ".".join(map(str, names.NFTABLES_MIN_KERNEL))
    if version is None:
        return _check("kernel", "warn", f"cannot read a version from kernel release {release!r}")
    if version >= names.NFTABLES_MIN_KERNEL:
        return _check("kernel", "pass", f"kernel {release} >= {need}, nftables mode's minimum")
    return _check(
        "kernel",
        "fail",
        f"kernel {release} < {need}: kube-proxy refuses nftables mode on it; upgrade the kernel "
        "first",
    )


def _running_mode(snap: Snapshot) -> str | None:
    pm = snap.kube_proxy.proxy_mode
    return pm.data if pm.status == "ok" else None


def check_kube_proxy_mode(snap: Snapshot) -> Check:
    pm = snap.kube_proxy.proxy_mode
    if pm.status != "ok" or pm.data is None:
        return _check(
            "kube-proxy-mode",
            "warn",
            f"could not check the mode kube-proxy runs: /proxyMode {pm.status}: {pm.error}",
        )
    note = {
        "nftables": "already nftables mode; run verify",
        "ipvs": "ipvs mode: the migration changes the data plane",
        "iptables": "iptables mode: the migration changes the data plane",
    }.get(pm.data, "not a Linux proxy mode")
    return _check("kube-proxy-mode", "pass", f"/proxyMode answers {pm.data} ({note})")


def _config_unknown(config: Reading[KubeProxyConfig | None]) -> str:
    return f"kube-proxy's configuration could not be read: {config.error}"


def _not_read(what: str) -> str:
    return f"could not check {what}: kube-proxy's configuration was not read (see mode-pinned)"


def check_mode_pinned(
    snap: Snapshot, config: Reading[KubeProxyConfig | None]
) -> tuple[Check, bool | None]:
    """The check, and whether a mode is pinned (None when unknowable)."""
    cfg = config.data
    if config.status != "ok" or cfg is None:
        evidence = [_config_unknown(config)]
        if cfg is not None and cfg.ignored_flags:
            evidence.append(f"kube-proxy's command line: {' '.join(cfg.cmdline)}")
        return _check("mode-pinned", "warn", *evidence), None
    evidence = [f"read from {cfg.origin}"]
    if cfg.config_file:
        evidence.append(f"configuration file {cfg.config_file}")
    if cfg.ignored_flags:
        evidence.append(f"flags ignored because --config is given: {', '.join(cfg.ignored_flags)}")
    running = _running_mode(snap)
    if not cfg.mode:
        evidence.append(
            "no mode pinned (mode is empty): kube-proxy picks its default (iptables on Linux); "
            "pin mode: nftables so that a restart or an upgrade cannot change the data plane"
        )
        evidence.append(DEFAULT_MODE_WARNING)
        return _check("mode-pinned", "warn", *evidence), False
    evidence.append(f"mode {cfg.mode} pinned by {cfg.origins.get('mode', 'the configuration')}")
    if running is not None and running != cfg.mode:
        evidence.append(
            f"but /proxyMode answers {running}: the configuration changed and kube-proxy has not "
            "restarted, or another configuration is in effect"
        )
        return _check("mode-pinned", "warn", *evidence), True
    if cfg.mode != "nftables":
        evidence.append("change it to nftables to migrate")
    return _check("mode-pinned", "pass", *evidence), True


def primary_node_ips(
    snap: Snapshot, config: KubeProxyConfig | None, hints: NodeIpHints
) -> tuple[dict[str, str], list[str]]:
    """family -> primary node IP, and how each was found (or why one could not be)."""
    node = [_bare(a) for a in snap.links.data.node_addresses]
    by_family: dict[str, list[str]] = {}
    for a in node:
        by_family.setdefault(_family(a), []).append(a)
    primary: dict[str, str] = {}
    how: list[str] = []
    for a in hints.explicit:
        primary.setdefault(_family(a), _bare(a))
    for fam, a in sorted(primary.items()):
        how.append(f"primary {fam} {a} from --node-ip")
    bind = config.bind_address if config else None
    if bind:
        try:
            ip = ipaddress.ip_address(bind)
        except ValueError:
            ip = None
        if ip is not None and not ip.is_unspecified and _family(bind) not in primary:
            primary[_family(bind)] = str(ip)
            how.append(f"primary {_family(bind)} {ip} from kube-proxy's bindAddress")
    for fam, src in sorted((hints.route_sources or {}).items()):
        if fam not in primary and _bare(src) in node:
            primary[fam] = _bare(src)
            how.append(f"primary {fam} {_bare(src)}: source address of the default route")
    for fam, addrs in sorted(by_family.items()):
        if fam in primary:
            continue
        if len(addrs) == 1:
            primary[fam] = addrs[0]
            how.append(f"primary {fam} {addrs[0]}: the node's only {fam} address")
        else:
            how.append(
                f"cannot tell the primary {fam} address among {', '.join(addrs)} (no default "
                "route, no bindAddress): pass --node-ip"
            )
    return primary, how


def _inside(addresses: list[str], cidrs: Iterable[str]) -> list[str]:
    """The addresses inside any of these CIDRs (one that is not a CIDR counts for none)."""
    nets = []
    for c in cidrs:
        try:
            nets.append(ipaddress.ip_network(c, strict=False))
        except ValueError:
            continue
    return [a for a in addresses if any(ipaddress.ip_address(a) in n for n in nets)]


def check_nodeport_addresses(
    snap: Snapshot, config: Reading[KubeProxyConfig | None], hints: NodeIpHints
) -> Check:
    name = "nodeport-addresses"
    if snap.links.status == "error":
        return _check(name, "warn", f"could not read the node's addresses: {snap.links.error}")
    cfg = config.data if config.status == "ok" else None
    npa = cfg.node_port_addresses if cfg else None
    node = [_bare(a) for a in snap.links.data.node_addresses]
    loopback = (
        "NodePorts on loopback (127.0.0.1, ::1) are never served in nftables mode; see "
        "localhost-nodeports"
    )
    if npa and list(npa) != ["primary"]:
        origin = cfg.origins.get("node_port_addresses", "") if cfg else ""
        served = _inside(node, npa)
        return _check(
            name,
            "pass",
            f"nodePortAddresses {', '.join(npa)} ({origin}): nftables mode serves NodePorts on "
            "the same addresses",
            f"node addresses inside: {', '.join(served) or 'none'}",
            loopback,
        )
    primary, how = primary_node_ips(snap, cfg, hints)
    evidence: list[str] = []
    status: Status = "pass"
    if cfg is None:
        status = "warn"
        evidence.append(_not_read("nodePortAddresses"))
        evidence.append("assuming it is unset, nftables mode's default (primary) applies:")
    else:
        if npa is None:
            setting = "nodePortAddresses not set"
        else:
            shown = ", ".join(npa) or "empty"
            setting = f"nodePortAddresses {shown} ({cfg.origins.get('node_port_addresses', '')})"
        evidence.append(f"{setting}: nftables mode serves NodePorts on the primary node IP(s) only")
    evidence += how
    unknown = [
        fam for fam in {_family(a) for a in node} if fam not in primary
    ]  # families whose primary could not be told
    secondary = [a for a in node if primary.get(_family(a)) not in (None, a)]
    if unknown:
        status = "warn"
    if secondary:
        status = "warn"
        evidence.append(
            "NodePorts stop answering on the secondary address(es) "
            f"{', '.join(_listed(secondary))}; set nodePortAddresses to keep them"
        )
    elif primary:
        evidence.append(f"NodePorts keep answering on {', '.join(sorted(primary.values()))}")
    evidence.append(loopback)
    return _check(name, status, *evidence)


def _counter_check(
    snap: Snapshot, name: str, metric: str, value: float | None, seen: str, after: str
) -> Check:
    m = snap.kube_proxy.metrics
    if m.status != "ok" or m.data is None:
        return _check(
            name, "warn", f"could not check {metric}: kube-proxy /metrics {m.status}: {m.error}"
        )
    mode = _running_mode(snap)
    if value is None:
        if mode in ("ipvs", "nftables"):
            return _check(
                name,
                "pass",
                f"{metric} not exported: kube-proxy runs {mode} mode, where no rule counts them",
            )
        return _check(
            name,
            "warn",
            f"{metric} absent from kube-proxy's /metrics (mode {mode or 'unknown'}): cannot tell "
            f"whether {seen}",
        )
    if value > 0:
        return _check(name, "warn", f"{metric} = {value:g}: {seen} ({after})")
    return _check(name, "pass", f"{metric} = 0 since kube-proxy started")


def check_localhost_nodeports(snap: Snapshot) -> Check:
    m = snap.kube_proxy.metrics.data
    return _counter_check(
        snap,
        "localhost-nodeports",
        "kubeproxy_iptables_localhost_nodeports_accepted_packets_total",
        m.localhost_nodeport_packets if m else None,
        "clients reach NodePorts on 127.0.0.1",
        "nftables mode never serves NodePorts on loopback: those clients break",
    )


def check_conntrack_invalid(snap: Snapshot) -> Check:
    m = snap.kube_proxy.metrics.data
    return _counter_check(
        snap,
        "conntrack-invalid",
        "kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
        m.ct_state_invalid_dropped if m else None,
        "iptables mode drops packets conntrack marks INVALID",
        "nftables mode has no such drop rule: expect them to reach pods and hosts, e.g. as "
        "spurious resets",
    )


def _key(t: IptTable) -> tuple[str, str, str]:
    return (t.backend, t.family, t.name)


def foreign_references(snap: Snapshot, c: Classification) -> list[str]:
    """Rules outside kube-proxy's and the kubelet's chains that jump to a KUBE-* chain or match
    a KUBE-* set, in both backends; each as `backend/family/table -A CHAIN RULE (why)`."""
    own_jumps = {
        (_key(f.obj.table), f.obj.rule.chain, f.obj.rule.text)
        for f in c.of(RuleRef, *KUBE_PROXY_CLASSES, Owner.KUBELET)
    }
    out: list[str] = []
    for ref in c.references:  # the classifier's: every rule naming a KUBE-* chain or set
        if ref.owner in KUBE_PROXY_CLASSES or ref.owner is Owner.KUBELET:
            continue  # kube-proxy's or the kubelet's own chain
        t, rule = ref.table, ref.rule
        why: list[str] = []
        target = rule.target or ""
        if (
            target.startswith(names.KUBE_PREFIX)
            and chain_owner(t.name, target)[0] is not Owner.KUBELET
            and (_key(t), rule.chain, rule.text) not in own_jumps
        ):
            why.append(f"jumps to {target}")
        why += [f"matches set {s}" for s in rule.match_sets if s.startswith(names.KUBE_PREFIX)]
        if why:
            where = f"{t.backend}/{t.family}/{t.name}"
            out.append(f"{where} -A {ref.chain} {rule.text} ({'; '.join(why)})")
    return out


def check_foreign_references(snap: Snapshot, c: Classification) -> tuple[Check, int | None]:
    name = "foreign-references"
    errors = [
        f"could not read {n}: {r.error}"
        for n, r in (("iptables_legacy", snap.iptables_legacy), ("iptables_nft", snap.iptables_nft))
        if r.status == "error"
    ]
    refs = foreign_references(snap, c)
    if refs:
        return (
            _check(
                name,
                "fail",
                f"{len(refs)} rule(s) outside kube-proxy's chains reference KUBE-* chains or sets; "
                "they break silently when nftables mode removes them:",
                *_listed(refs),
                *errors,
            ),
            len(refs),
        )
    if errors:
        return _check(name, "warn", *errors), None
    n = sum(
        len(ch.rules)
        for t in (*snap.iptables_legacy.data, *snap.iptables_nft.data)
        for ch in t.chains
    )
    return (
        _check(
            name,
            "pass",
            f"no rule outside kube-proxy's chains references KUBE-* ({n} rules "
            "read in both backends)",
        ),
        0,
    )


def check_foreign_ipvs(snap: Snapshot, c: Classification) -> Check:
    name = "foreign-ipvs-services"
    r = snap.ipvs
    if r.status == "error":
        return _check(name, "warn", f"could not read IPVS: {r.error}")
    if r.status == "absent":
        return _check(name, "pass", "ip_vs is not loaded: no IPVS service to flush")
    foreign = c.of(IpvsService, Owner.FOREIGN)
    if not foreign:
        return _check(
            name, "pass", f"{len(r.data)} IPVS service(s), all kube-proxy's; none foreign"
        )
    rows = [f"{f.name} ({len(f.obj.dests)} real servers)" for f in foreign]
    return _check(
        name,
        "fail",
        f"{len(foreign)} IPVS service(s) not kube-proxy's (keepalived, kube-vip, LVS ...): "
        "kube-proxy flushes every IPVS service at each nftables-mode start; move them first",
        *_listed(rows),
    )


def _kube_schedulers(c: Classification) -> str | None:
    counts = Counter(f.obj.scheduler for f in c.of(IpvsService, Owner.IPVS_LEFTOVER))
    if not counts:
        return None
    return "kube-proxy's IPVS services use " + ", ".join(
        f"{s} ({n})" for s, n in sorted(counts.items())
    )


def check_ipvs_scheduler(
    snap: Snapshot, c: Classification, config: Reading[KubeProxyConfig | None]
) -> Check:
    name = "ipvs-scheduler"
    live = _kube_schedulers(c)
    cfg = config.data if config.status == "ok" else None
    if cfg is None:
        return _check(
            name,
            "warn",
            _not_read("ipvs.scheduler"),
            *([live] if live else []),
        )
    evidence = [live] if live else []
    if cfg.ipvs_scheduler:
        return _check(
            name,
            "warn",
            f"ipvs.scheduler {cfg.ipvs_scheduler} ({cfg.origins.get('ipvs_scheduler', '')}) "
            "becomes dead configuration: nftables mode has no schedulers (it picks endpoints "
            "at random); remove it",
            *evidence,
        )
    return _check(name, "pass", "ipvs.scheduler not set", *evidence)


def check_strict_arp(snap: Snapshot, config: Reading[KubeProxyConfig | None]) -> Check:
    name = "strict-arp"
    sysctls = snap.kernel.data.sysctls
    evidence: list[str] = []
    status: Status = "pass"
    set_now = [f"{k}={sysctls[k]}" for k, v in names.ARP_SYSCTLS.items() if sysctls.get(k) == v]
    cfg = config.data if config.status == "ok" else None
    if cfg is None:
        status = "warn"
        evidence.append(_not_read("ipvs.strictARP"))
    elif cfg.ipvs_strict_arp:
        status = "warn"
        evidence.append(
            f"ipvs.strictARP true ({cfg.origins.get('ipvs_strict_arp', '')}) becomes dead "
            "configuration in nftables mode; remove it"
        )
    else:
        evidence.append("ipvs.strictARP not set")
    if set_now:
        status = "warn"
        evidence.append(
            f"{' '.join(set_now)} (strictARP's values) stay after the migration: no kube-proxy "
            "mode resets them; keep them if MetalLB/kube-vip L2 needs them, else "
            "cleanup --reset-arp-sysctls"
        )
    else:
        shown = [f"{k}={sysctls.get(k, '?')}" for k in names.ARP_SYSCTLS]
        evidence.append(f"{' '.join(shown)}: not strictARP's values")
    return _check(name, status, *evidence)


def precheck(
    snap: Snapshot,
    c: Classification,
    config: Reading[KubeProxyConfig | None],
    hints: NodeIpHints | None = None,
) -> list[Check]:
    """Can this node move to nftables mode, and what will change (docs/precheck-verify.md)."""
    hints = hints or NodeIpHints()
    return [
        check_kernel(snap),
        check_kube_proxy_mode(snap),
        check_mode_pinned(snap, config)[0],
        check_nodeport_addresses(snap, config, hints),
        check_localhost_nodeports(snap),
        check_conntrack_invalid(snap),
        check_foreign_references(snap, c)[0],
        check_foreign_ipvs(snap, c),
        check_ipvs_scheduler(snap, c, config),
        check_strict_arp(snap, config),
        check_ipvs_deprecation(snap),
    ]


def readiness_metrics(
    snap: Snapshot, c: Classification, config: Reading[KubeProxyConfig | None]
) -> dict[str, float]:
    """Gauges for `serve` (readiness, docs/contract.md#metrics); a value that cannot be known
    is left out."""
    out: dict[str, float] = {}
    version = snap.kernel.data.version()
    if version is not None:
        out["ipvs_leftovers_nftables_kernel_ready"] = float(version >= names.NFTABLES_MIN_KERNEL)
    pinned = check_mode_pinned(snap, config)[1]
    if pinned is not None:
        out["ipvs_leftovers_kube_proxy_mode_pinned"] = float(pinned)
    refs = check_foreign_references(snap, c)[1]
    if refs is not None:
        out["ipvs_leftovers_foreign_references"] = float(refs)
    m = snap.kube_proxy.metrics.data
    if m is not None and m.localhost_nodeport_packets is not None:
        out["ipvs_leftovers_localhost_nodeport_packets"] = m.localhost_nodeport_packets
    return out
