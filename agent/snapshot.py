"""Plain, immutable data the readers return: the node as it was when read.

Every reader returns a `Reading`: its data plus a status. `absent` means the kernel subsystem or
endpoint is not there (a successful read of "nothing"); `error` means it is there and could not be
read, and carries the error text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar, overload

Status = Literal["ok", "absent", "error"]

# The vocabulary every reader converts to, written once. The IP family has one spelling per
# place it comes from; each reader turns its source's into these.
IpVersion = Literal[4, 6]  # IPVS and ipset families (AF_INET / AF_INET6, inet / inet6)
Family = Literal["ipv4", "ipv6"]  # iptables tables, metric labels, the report
Backend = Literal["legacy", "nft"]  # the iptables backends
IpvsProtocol = Literal["TCP", "UDP", "SCTP", "FWM"]  # FWM: a firewall-mark virtual server
NftFamily = Literal["inet", "ip", "arp", "netdev", "bridge", "ip6"]  # nftables' table families


def family_of(version: IpVersion) -> Family:
    return "ipv6" if version == 6 else "ipv4"


def as_backend(text: str) -> Backend:
    """The backend a name (a bundle file's, a tool's) stands for; ValueError for none."""
    if text == "legacy":
        return "legacy"
    if text == "nft":
        return "nft"
    raise ValueError(f"no iptables backend {text!r}")


def as_family(text: str) -> Family:
    """The family a name (a bundle file's, a label's) stands for; ValueError for none."""
    if text == "ipv4":
        return "ipv4"
    if text == "ipv6":
        return "ipv6"
    raise ValueError(f"no IP family {text!r}")


T = TypeVar("T", covariant=True)


@dataclass(frozen=True)
class Reading(Generic[T]):
    """One source as read: its status, what it gave, and why not when it failed."""

    status: Status
    data: T
    error: str | None = None
    seconds: float = 0.0


# --- IPVS -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IpvsDest:
    """A real server of an IPVS virtual server, with its forwarding method and counters."""

    address: str
    port: int
    forward: str  # masq | local | tunnel | route | bypass
    weight: int
    active_conns: int = 0
    inactive_conns: int = 0
    persist_conns: int = 0
    # tunnel forwarding only (IPVS_DEST_ATTR_TUN_*): ipip=0 | gue=1 | gre=2, its UDP port, flags
    tun_type: int = 0
    tun_port: int = 0
    tun_flags: int = 0


class _DeferredDests(Sequence[IpvsDest]):
    """Real servers decoded (or fetched) on first look; compares equal to their tuple."""

    __slots__ = ("_decoded",)

    def __init__(self) -> None:
        self._decoded: tuple[IpvsDest, ...] | None = None

    def _load(self) -> tuple[IpvsDest, ...]:
        raise NotImplementedError

    def _known_length(self) -> int:
        raise NotImplementedError

    def _all(self) -> tuple[IpvsDest, ...]:
        if self._decoded is None:
            self._decoded = self._load()
        return self._decoded

    def __len__(self) -> int:
        return len(self._decoded) if self._decoded is not None else self._known_length()

    @overload
    def __getitem__(self, i: int) -> IpvsDest: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[IpvsDest]: ...
    def __getitem__(self, i: int | slice) -> IpvsDest | Sequence[IpvsDest]:
        return self._all()[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return self._all() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._all())

    def __repr__(self) -> str:
        return repr(self._all())


class LazyDests(_DeferredDests):
    """Real servers as the kernel sent them, decoded on first look.

    The scrape and the counts only need how many there are; decoding ~3 per Service was 40% of
    reading IPVS at 1,000 Services.
    """

    __slots__ = ("_raw", "_decode")

    def __init__(
        self, raw: tuple[memoryview, ...], decode: Callable[[memoryview], IpvsDest]
    ) -> None:
        super().__init__()
        self._raw = raw
        self._decode = decode

    def _load(self) -> tuple[IpvsDest, ...]:
        decoded = tuple(self._decode(r) for r in self._raw)
        self._raw = ()
        return decoded

    def _known_length(self) -> int:
        return len(self._raw)


class NotListed(LookupError):
    """The real servers of a virtual server this reading only counted."""


class CountedDests(Sequence[IpvsDest]):
    """Real servers known by their number only: data, no handle on the kernel.

    The IPVS reader counts each virtual server's real servers in /proc/net/ip_vs, one read
    of the whole table (node_exporter's source), instead of one netlink dump per virtual
    server: the scrape, the counts and the plan need only the number. Whatever needs the
    servers themselves (the backup bundle, the re-check) lists them through
    agent.readers.ipvs.RealServers.
    """

    __slots__ = ("_count",)

    def __init__(self, count: int) -> None:
        self._count = count

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, i: int) -> IpvsDest: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[IpvsDest]: ...
    def __getitem__(self, i: int | slice) -> IpvsDest | Sequence[IpvsDest]:
        raise NotListed(f"{self._count} real servers counted, not listed, in this reading")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CountedDests):
            return self._count == other._count
        return NotImplemented

    def __hash__(self) -> int:
        return hash((CountedDests, self._count))

    def __repr__(self) -> str:
        return f"CountedDests({self._count})"


@dataclass(frozen=True, slots=True)
class IpvsService:
    """An IPVS virtual server: protocol, address and port, or a firewall mark."""

    family: IpVersion
    # or the number of a protocol the reader has no name for
    protocol: IpvsProtocol | int
    address: str | None  # inet_ntop's spelling (the classifier compares it as is)
    port: int | None
    fwmark: int | None
    scheduler: str
    flags: int
    timeout: int
    dests: Sequence[IpvsDest] = ()
    # persistence granularity: an IPv4 mask as the kernel sends it (network order read as a
    # native u32), or an IPv6 prefix length; and the persistence engine (`--pe sip`)
    netmask: int = 0xFFFFFFFF
    pe_name: str = ""
    # connections IPVS tracks through its real servers (summed), as read: active (an
    # established TCP or SCTP connection) and inactive (closing, half-open, UDP). Not part
    # of the service's identity or contents: two reads of an unchanged node differ in them.
    active_conns: int = field(default=0, compare=False)
    inactive_conns: int = field(default=0, compare=False)

    @property
    def key(self) -> str:
        """The service as ipvsadm names it: `TCP 10.96.0.1:443`, `TCP [fd00::1]:443`."""
        if self.fwmark:
            return f"FWM {self.fwmark} IPv{self.family}"
        host = f"[{self.address}]" if self.family == 6 else str(self.address)
        return f"{self.protocol} {host}:{self.port}"


# --- ipsets ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ipset:
    """An ipset: its header, and its members when the classifier needs them."""

    name: str
    type: str
    family: IpVersion | None  # None for family-less types (bitmap:port)
    elements: int
    references: int
    # Members in `ipset save` notation (`10.96.0.1,tcp:443`, `30080`); None when not read.
    entries: tuple[str, ...] | None = None


# --- iptables (both backends) ---------------------------------------------------------------

BUILTIN_CHAINS = frozenset({"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"})


@dataclass(frozen=True)
class IptRule:
    """One iptables rule, as iptables-save prints it."""

    chain: str
    text: str  # the rule exactly as iptables-save prints it, after `-A CHAIN `
    target: str | None  # -j / -g target
    comment: str | None
    match_sets: tuple[str, ...] = ()


@dataclass(frozen=True)
class IptChain:
    """One iptables chain and its rules."""

    name: str
    rules: tuple[IptRule, ...]

    @property
    def builtin(self) -> bool:
        return self.name in BUILTIN_CHAINS


@dataclass(frozen=True)
class IptTable:
    """One iptables table of one backend and family."""

    backend: Backend
    family: Family
    name: str  # nat | filter | mangle | raw | security
    chains: tuple[IptChain, ...]


# --- nftables -------------------------------------------------------------------------------


@dataclass(frozen=True)
class NftSet:
    """A named nftables set or map, and how many elements it holds."""

    name: str
    is_map: bool
    elements: int | None  # None when not counted


@dataclass(frozen=True)
class NftTable:
    """An nftables table: its chain count and, for kube-proxy's, its sets."""

    # or the number of a family the agent has no name for (the kernel reports it; nothing
    # matches it)
    family: NftFamily | int
    name: str
    chains: int = 0
    sets: tuple[NftSet, ...] = ()
    # kube-proxy's tables: the mark bit its `masquerading` chain masquerades, if any
    masquerade_mark: int | None = None
    # kube-proxy's tables: which of names.NFTABLES_MODE_CHAINS it holds (the gate needs all)
    kube_proxy_chains: tuple[str, ...] = ()
    # kube-proxy's tables, read when they can attribute a virtual server: the keys of its
    # service maps (docs/contract.md#ownership), `(address, protocol, port)` of `service-ips` and
    # `no-endpoint-services`, `(protocol, port)` of `service-nodeports` and
    # `no-endpoint-nodeports`; protocol lower-case (tcp, udp, sctp) as kube-proxy writes it.
    services: frozenset[tuple[str, str, int]] = frozenset()
    node_ports: frozenset[tuple[str, int]] = frozenset()


# --- links ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    """A network link: kind, state and addresses."""

    name: str
    index: int
    kind: str | None
    up: bool
    addresses: tuple[str, ...]  # "10.96.0.1/32", "fd00::1/128"
    # the queue length: kube-proxy v1.34+ makes kube-ipvs0 with 0, `ip link add` with 1000
    txqlen: int | None = None


@dataclass(frozen=True)
class Links:
    """kube-ipvs0 and the node's own addresses on every other link."""

    kube_ipvs0: Link | None
    # The node's own addresses on every other link, without prefix length.
    node_addresses: tuple[str, ...] = ()


# --- kernel facts ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Kernel:
    """Kernel release, the sysctls ipvs mode sets and which subsystems are loaded."""

    release: str
    sysctls: dict[str, str] = field(default_factory=dict)
    # True loaded, False not loaded, None unknowable (a kernel without module support)
    subsystems: dict[str, bool | None] = field(default_factory=dict)

    def version(self) -> tuple[int, int] | None:
        """(major, minor) of the release; None when it does not start with them."""
        m = re.match(r"(\d+)\.(\d+)", self.release)
        return (int(m.group(1)), int(m.group(2))) if m else None


# --- kube-proxy -----------------------------------------------------------------------------


@dataclass(frozen=True)
class KubeProxyMetrics:
    """What kube-proxy's /metrics says about its syncs and its mode."""

    # kubeproxy_sync_proxy_rules_last_timestamp_seconds, by ip_family (None when unlabelled).
    last_sync: dict[Family | None, float] = field(default_factory=dict)
    nftables_sync_failures: float | None = None  # summed over the families
    # By ip_family, for the gate's sync conditions: ..._nftables_sync_failures_total (absent
    # until the family's first failed transaction) and ..._last_queued_timestamp_seconds (the
    # last change kube-proxy was told of), both kubeproxy_sync_proxy_rules_*.
    sync_failures: dict[Family | None, float] = field(default_factory=dict)
    last_queued: dict[Family | None, float] = field(default_factory=dict)
    nftables_series: bool = False
    ipvs_series: bool = False
    iptables_series: bool = False
    localhost_nodeport_packets: float | None = None
    ct_state_invalid_dropped: float | None = None
    # kubernetes_feature_enabled{name="KubeProxyIPVS"} (v1.37+): (value, stage); None if absent
    ipvs_feature_gate: tuple[float, str] | None = None


@dataclass(frozen=True)
class KubeProxyConfigz:
    """What kube-proxy's /configz says of the settings that attribute leftovers: its live,
    defaulted configuration (docs/contract.md#ownership)."""

    mode: str | None = None
    node_port_addresses: tuple[str, ...] = ()  # as configured: CIDRs and keywords
    strict_arp: bool | None = None  # ipvs.strictARP
    iptables_masquerade_bit: int | None = None  # the bit ipvs and iptables mode mark with
    nftables_masquerade_bit: int | None = None


@dataclass(frozen=True)
class KubeProxyHealth:
    """kube-proxy's /healthz or /livez answer."""

    http_status: int
    healthy: bool
    last_updated: float | None  # unix seconds
    current_time: float | None
    families: dict[Family, float | None] = field(default_factory=dict)  # -> lastUpdated
    # /healthz's nodeEligible: false while the node is being deleted or tainted
    # ToBeDeletedByClusterAutoscaler (then /healthz is 503 whatever the proxier's state).
    node_eligible: bool | None = None


def _not_read() -> Reading[KubeProxyHealth | None]:
    return Reading("absent", None, "not read")


def _not_read_configz() -> Reading[KubeProxyConfigz | None]:
    return Reading("absent", None, "not read")


@dataclass(frozen=True)
class KubeProxy:
    """What kube-proxy's endpoints answered, and when."""

    proxy_mode: Reading[str | None]
    metrics: Reading[KubeProxyMetrics | None]
    healthz: Reading[KubeProxyHealth | None]
    read_at: float = 0.0  # unix seconds when read, for freshness checks
    # /livez: the proxier's health without node eligibility (absent before kube-proxy 1.28).
    livez: Reading[KubeProxyHealth | None] = field(default_factory=_not_read)
    # /configz on the metrics port: its effective configuration (every release tested).
    configz: Reading[KubeProxyConfigz | None] = field(default_factory=_not_read_configz)


# --- the whole node -------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """Every source read once: what the classifier classifies."""

    ipvs: Reading[tuple[IpvsService, ...]]
    ipsets: Reading[tuple[Ipset, ...]]
    iptables_legacy: Reading[tuple[IptTable, ...]]
    iptables_nft: Reading[tuple[IptTable, ...]]
    nftables: Reading[tuple[NftTable, ...]]
    links: Reading[Links]
    kernel: Reading[Kernel]
    kube_proxy: KubeProxy

    def sources(self) -> dict[str, Reading[object]]:
        """Every source by its name in the report and the metrics."""
        return {
            "ipvs": self.ipvs,
            "ipsets": self.ipsets,
            "iptables_legacy": self.iptables_legacy,
            "iptables_nft": self.iptables_nft,
            "nftables": self.nftables,
            "links": self.links,
            "kernel": self.kernel,
            "kube_proxy_mode": self.kube_proxy.proxy_mode,
            "kube_proxy_metrics": self.kube_proxy.metrics,
            "kube_proxy_healthz": self.kube_proxy.healthz,
            "kube_proxy_livez": self.kube_proxy.livez,
        }
