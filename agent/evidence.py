"""What can attribute an IPVS virtual server to kube-proxy: the evidence of
docs/contract.md#ownership, indexed once per snapshot.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from dataclasses import dataclass

from agent import names
from agent.snapshot import Ipset, IpvsService, KubeProxyConfigz, Links, NftTable


@dataclass(frozen=True)
class Network:
    """A CIDR, compared as integers: `ipaddress` costs the audit's start (its imports)."""

    bits: int  # 32 or 128
    prefix: int  # the network's leading bits, as an integer
    length: int

    @classmethod
    def parse(cls, text: str) -> Network | None:
        addr, _, plen = text.strip().partition("/")
        af = socket.AF_INET6 if ":" in addr else socket.AF_INET
        bits = 128 if af == socket.AF_INET6 else 32
        try:
            value = int.from_bytes(socket.inet_pton(af, addr), "big")
            length = int(plen) if plen else bits
        except (OSError, ValueError):
            return None
        if not 0 <= length <= bits:
            return None
        return cls(bits, value >> (bits - length), length)

    def __contains__(self, addr: object) -> bool:
        if not isinstance(addr, str):
            return False
        af = socket.AF_INET6 if ":" in addr else socket.AF_INET
        if (af == socket.AF_INET6) != (self.bits == 128):
            return False
        try:
            value = int.from_bytes(socket.inet_pton(af, addr), "big")
        except OSError:
            return False
        return value >> (self.bits - self.length) == self.prefix

    def __str__(self) -> str:
        af = socket.AF_INET6 if self.bits == 128 else socket.AF_INET
        packed = (self.prefix << (self.bits - self.length)).to_bytes(self.bits // 8, "big")
        return f"{socket.inet_ntop(af, packed)}/{self.length}"


def _addr(text: str) -> str:
    """`text` (optionally with a prefix length) in the kernel's canonical spelling.

    inet_pton/inet_ntop rather than `ipaddress`: this runs once per virtual server on every
    scrape, and the C round trip is an order of magnitude cheaper.
    """
    bare = text.split("/", 1)[0]
    af = socket.AF_INET6 if ":" in bare else socket.AF_INET
    try:
        return socket.inet_ntop(af, socket.inet_pton(af, bare))
    except OSError:
        return bare  # not an address: compares equal to nothing the kernel reports


@dataclass(frozen=True)
class IpvsEvidence:
    """What can attribute a virtual server to kube-proxy, indexed once per snapshot.

    Building it is linear in addresses and set members; asking it about one service is a few
    hash lookups, so attributing every service of a node stays linear.
    """

    bound: frozenset[str]  # addresses on kube-ipvs0
    node: frozenset[str]  # the node's own addresses elsewhere
    members: dict[str, frozenset[str]]  # decoded KUBE-* set -> its members
    # the running nftables mode's service maps: (address, proto, port), (proto, port)
    served: frozenset[tuple[str, str, int]] = frozenset()
    served_node_ports: frozenset[tuple[str, int]] = frozenset()
    # /configz nodePortAddresses: its explicit CIDRs, none of them a /0 (docs/contract.md)
    node_port_nets: tuple[Network, ...] = ()

    @classmethod
    def of(
        cls,
        links: Links,
        sets: Iterable[Ipset] = (),
        tables: Iterable[NftTable] = (),
        configz: KubeProxyConfigz | None = None,
    ) -> IpvsEvidence:
        bound = links.kube_ipvs0.addresses if links.kube_ipvs0 else ()
        own = [t for t in tables if (t.family, t.name) in names.NFTABLES_MODE_TABLES]
        return cls(
            bound=frozenset(_addr(a) for a in bound),
            node=frozenset(_addr(a) for a in links.node_addresses),
            members={
                s.name: frozenset(s.entries)
                for s in sets
                if s.entries and (s.name in names.VIP_PORT_SETS or s.name in _ALL_NODE_PORT_SETS)
            },
            served=frozenset((_addr(a), pr, po) for t in own for a, pr, po in t.services),
            served_node_ports=frozenset(pp for t in own for pp in t.node_ports),
            node_port_nets=node_port_nets(configz),
        )

    def sets_needed(self, svc: IpvsService) -> frozenset[str]:
        """The sets whose members can name `svc`'s address and port (docs/contract.md#ownership)."""
        if svc.address is None or (svc.protocol, svc.address, svc.port) == names.PROBE_SERVICE:
            return frozenset()  # fwmark services are never kube-proxy's; the probe is known
        # A NodePort, or an ExternalIP / LoadBalancer IP that is a node address; or a NodePort
        # of an address the node no longer has (weak alone; made strong by what nftables mode
        # serves and /configz). The NodePort sets are bitmaps of their protocol: small.
        return names.NODE_PORT_SETS.get(str(svc.protocol), frozenset()) | names.VIP_PORT_SETS

    def of_service(self, svc: IpvsService) -> Attribution:
        """What names `svc` as kube-proxy's: strong evidence names its address and port."""
        if svc.address is None or svc.port is None:
            return Attribution()  # kube-proxy's ipvs mode never makes fwmark services
        addr = svc.address  # the reader's inet_ntop spelling, as the indexes hold
        strong: list[str] = []
        weak: list[str] = []
        off_node = False  # a NodePort set names the port, off the node's addresses
        member = f"{addr},{str(svc.protocol).lower()}:{svc.port}"
        node_port_sets = names.NODE_PORT_SETS.get(str(svc.protocol), frozenset())
        for name in sorted(self.members):
            entries = self.members[name]
            if name in names.VIP_PORT_SETS and member in entries:
                strong.append(f"{member} is a member of ipset {name}")
            elif name in node_port_sets and str(svc.port) in entries:
                if addr in self.node:
                    strong.append(f"NodePort {svc.port} on node address {addr} is in ipset {name}")
                else:
                    off_node = True
                    weak.append(
                        f"port {svc.port} is in ipset {name}, but {addr} is not a node address"
                    )
        if (svc.protocol, addr, svc.port) == names.PROBE_SERVICE:
            proto, address, port = names.PROBE_SERVICE
            strong.append(f"kube-proxy's ipvs probe service {address}:{port}/{proto}")
        if addr in self.bound:
            weak.append(f"address {addr} is bound to {names.KUBE_IPVS0} (any port would be)")
        if not strong and weak:
            strong += self._served(svc, addr, off_node)
        return Attribution(tuple(strong), tuple(weak))

    def _served(self, svc: IpvsService, addr: str, off_node: bool) -> list[str]:
        """Weak evidence made strong by the running nftables mode's own record of the same
        Service (docs/contract.md#ownership, "What the nftables mode serves")."""
        proto, port = str(svc.protocol).lower(), int(svc.port or 0)
        if addr in self.bound and (addr, proto, port) in self.served:
            maps = "/".join(names.NFTABLES_SERVICE_MAPS)
            return [
                f"{addr}:{port}/{proto} is bound to {names.KUBE_IPVS0} and is a Service IP and "
                f"port the running nftables mode serves (its {maps} map)"
            ]
        if off_node and (proto, port) in self.served_node_ports:
            net = next((n for n in self.node_port_nets if addr in n), None)
            if net is not None:
                return [
                    f"NodePort {port}/{proto} is in an ipvs-mode set and the running nftables "
                    f"mode serves it (its {'/'.join(names.NFTABLES_NODE_PORT_MAPS)} map), and "
                    f"{addr} is inside kube-proxy's nodePortAddresses {net} (/configz): a "
                    "NodePort of an address the node no longer has"
                ]
        return []


@dataclass(frozen=True)
class Attribution:
    """Why a virtual server may be kube-proxy's (docs/contract.md#ownership).

    `strong` names its address and port in kube-proxy's own records; `weak` names only one of
    them (a kube-ipvs0 address, a NodePort number off the node's addresses), which a
    keepalived service set up later on a reused address or port would also show.
    """

    strong: tuple[str, ...] = ()
    weak: tuple[str, ...] = ()


_ALL_NODE_PORT_SETS = frozenset().union(*names.NODE_PORT_SETS.values())


def node_port_nets(configz: KubeProxyConfigz | None) -> tuple[Network, ...]:
    """The explicit CIDRs of kube-proxy's nodePortAddresses. Keywords (`primary`,
    `localhost`, `all`) and /0 networks name no address range of this node's own: an address
    outside the node could be anything, so they attribute nothing."""
    out: list[Network] = []
    for text in configz.node_port_addresses if configz else ():
        net = Network.parse(text)
        if net is not None and net.length > 0:
            out.append(net)
    return tuple(out)


def evidence_sets_needed(services: Iterable[IpvsService], links: Links) -> frozenset[str]:
    """The ipsets whose members can attribute a virtual server not bound on kube-ipvs0.

    Only those sets are decoded: a NodePort on a node address needs the small bitmap sets of
    its protocol, anything else the `IP,proto:port` sets.
    """
    # only the node's addresses: kube-ipvs0's thousands are not needed to choose sets
    index = IpvsEvidence.of(Links(kube_ipvs0=None, node_addresses=links.node_addresses))
    needed: set[str] = set()
    for s in services:
        needed |= index.sets_needed(s)
    return frozenset(needed)


def service_maps_needed(services: Iterable[IpvsService], links: Links) -> bool:
    """Whether nftables mode's service maps can attribute anything: a virtual server on an
    address of kube-ipvs0 or off the node's addresses (the two weak shapes they make strong).
    A node with IPVS left only on node addresses never dumps them (serve's scrapes)."""
    node = {_addr(a) for a in links.node_addresses}
    has_link = links.kube_ipvs0 is not None
    return any(s.address is not None and (has_link or s.address not in node) for s in services)
