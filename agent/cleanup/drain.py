"""Live connections through the virtual servers a cleanup deletes
(docs/contract.md#live-connections).

ipvs mode sets `net.ipv4.vs.expire_nodest_conn=1` (k8s.io/kubernetes pkg/proxy/ipvs/proxier.go):
once a virtual server is deleted, the next packet of a connection IPVS tracks through it expires
that connection, and it is cut. kube-proxy itself, removing a TCP real server, waits for its
connections to end (graceful_termination.go); a cleanup deletes whole virtual servers, so it
waits too: for the active (established) connections, up to `--drain-timeout`, reading the
counts again each second; then it refuses, unless told to cut them (`--cut-connections`).

The counts come from /proc/net/ip_vs (ActiveConn, InActConn of each real server): one read of
the table per second, nothing changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from agent import names
from agent.cleanup.plan import DeleteService, Plan
from agent.readers import ipvs
from agent.snapshot import IpvsService

# The kubelet's default grace period: what a removed Pod is given to finish its connections. A
# cleanup gives the connections of the Services ipvs mode left the same, then asks the operator.
DEFAULT_TIMEOUT = float(names.DEFAULT_TERMINATION_GRACE_SECONDS)
POLL = 1.0  # seconds between two reads of the counts while waiting
SHOWN = 3  # virtual servers a refusal names, busiest first


@dataclass(frozen=True)
class Connections:
    """Connections IPVS tracks through a set of virtual servers, as read once."""

    active: int = 0
    inactive: int = 0
    busiest: tuple[tuple[str, int], ...] = ()  # (virtual server, active), most active first

    @property
    def services(self) -> int:
        """Virtual servers with an active connection."""
        return len(self.busiest)

    def describe(self) -> str:
        """`3 active connections (1 inactive) through 2 virtual servers: TCP 10.96.0.10:80 (2),
        TCP 10.96.0.11:443 (1)`: the busiest named, at most SHOWN."""
        text = f"{_count(self.active, 'active connection')} ({self.inactive} inactive)"
        if not self.busiest:
            return text
        shown = ", ".join(f"{name} ({n})" for name, n in self.busiest[:SHOWN])
        more = f" and {self.services - SHOWN} more" if self.services > SHOWN else ""
        return f"{text} through {_count(self.services, 'virtual server')}: {shown}{more}"

    def as_json(self) -> dict[str, int]:
        return {"active": self.active, "inactive": self.inactive}


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def tally(counts: Iterable[tuple[str, int, int]]) -> Connections:
    """Connections from (virtual server, active, inactive) rows."""
    rows = list(counts)
    busy = sorted(((name, a) for name, a, _ in rows if a > 0), key=lambda r: (-r[1], r[0]))
    return Connections(sum(r[1] for r in rows), sum(r[2] for r in rows), tuple(busy))


def planned(plan: Plan) -> list[IpvsService]:
    return [s.service for s in plan.steps if isinstance(s, DeleteService)]


def of_plan(plan: Plan) -> Connections:
    """The connections through the plan's virtual servers, as the plan's reading saw them."""
    return tally((s.key, s.active_conns, s.inactive_conns) for s in planned(plan))


def reread(
    services: list[IpvsService],
    read: Callable[[], Mapping[ipvs.ProcKey, tuple[int, int]]] | None = None,
) -> Connections:
    """The same virtual servers' connections read again (by default ipvs.connections_of:
    /proc/net/ip_vs, and netlink by key for one /proc does not list); one no longer there
    has none (it is gone, and its connections with it)."""
    now = read() if read is not None else ipvs.connections_of(services)
    rows = []
    for s in services:
        active, inactive = now.get(ipvs.proc_key(s), (0, 0))
        rows.append((s.key, active, inactive))
    return tally(rows)


@dataclass(frozen=True)
class Drain:
    """How a wait ended: the last reading, and the seconds it took."""

    connections: Connections
    waited: float


def wait(
    first: Connections,
    again: Callable[[], Connections],
    timeout: float,
    between: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Drain:
    """Until no connection is active, or `timeout` seconds have passed: `again` is read each
    POLL seconds (and once more at the deadline); `between` runs before each read (the stop's
    check). A timeout of 0 reads nothing again."""
    start = clock()
    now = first
    while now.active:
        left = timeout - (clock() - start)
        if left <= 0:
            break
        sleep(min(POLL, left))
        between()
        now = again()
    return Drain(now, clock() - start)
