"""/proc/net/ip_vs: real servers counted per virtual server, as the kernel prints them."""

from __future__ import annotations

import io

from agent.readers.ipvs import proc_dest_counts

PROC = """\
IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
TCP  0A600001:01BB rr
  -> 0AF40003:192B      Masq    1      0          0
  -> 0AF40105:192B      Masq    3      0          0
UDP  0A60000A:0035 rr persistent 10800 FFFFFFFF
  -> 0AF40004:0035      Masq    1      0          0
SCTP  AC100005:2328 rr
TCP  [fd00:0096:0000:0000:0000:0000:0000:0001]:01BB rr
  -> [fd00:0010:0000:0000:0000:0000:0000:0004]:01BB      Masq    1      0          0
FWM  00000064 rr
  -> 0AF40009:0000      Route   1      0          0
FWM  000000C8 rr
FWM  000000C8 rr
  -> [fd00:0010:0000:0000:0000:0000:0000:0004]:0000      Route   1      0          0
"""


def test_counts_per_service_and_ambiguous_marks_left_out() -> None:
    assert proc_dest_counts(io.StringIO(PROC)) == {
        ("TCP", "10.96.0.1", 443): 2,
        ("UDP", "10.96.0.10", 53): 1,
        ("SCTP", "172.16.0.5", 9000): 0,
        ("TCP", "fd00:96::1", 443): 1,
        ("FWM", 100): 1,
    }


def test_an_empty_table() -> None:
    assert proc_dest_counts(io.StringIO(PROC.split("TCP  0A")[0])) == {}


def test_real_servers_as_listed_and_what_proc_cannot_say_left_out() -> None:
    from agent.readers.ipvs import proc_dests
    from agent.snapshot import IpvsDest

    text = PROC + (
        "TCP  C0A8010A:7580 wlc persistent 300 FFFFFF00\n"
        "  -> 0AF40005:1F90      Route   2      4          7\n"
        "  -> 0AF40006:1F90      Tunnel  1      0          0\n"
        "UDP  0A600016:13CD rr ops\n"
        "  -> 0AF40007:13CD      Local   0      0          0\n"
    )
    assert proc_dests(io.StringIO(text)) == {
        ("TCP", "10.96.0.1", 443): (
            IpvsDest("10.244.0.3", 6443, "masq", 1),
            IpvsDest("10.244.1.5", 6443, "masq", 3),
        ),
        ("UDP", "10.96.0.10", 53): (IpvsDest("10.244.0.4", 53, "masq", 1),),
        ("SCTP", "172.16.0.5", 9000): (),
        ("TCP", "fd00:96::1", 443): (IpvsDest("fd00:10::4", 443, "masq", 1),),
        ("FWM", 100): (IpvsDest("10.244.0.9", 0, "route", 1),),
        # 192.168.1.10:30080 has a tunnel: its type is not in /proc, netlink is asked
        ("UDP", "10.96.0.22", 5069): (IpvsDest("10.244.0.7", 5069, "local", 0),),
    }


def test_a_service_read_with_counted_dests_is_freed_without_the_cycle_collector() -> None:
    """serve drops each scrape's snapshot: a service its own dests referred to (through a
    fetch callable, once) lived on until a full collection, two snapshots or more at once.
    Counted real servers are a number now, with nothing that refers back."""
    import gc

    from agent.snapshot import CountedDests, IpvsService

    svc = IpvsService(4, "TCP", "10.96.0.1", 443, None, "rr", 2, 0)
    object.__setattr__(svc, "dests", CountedDests(3))
    assert len(svc.dests) == 3
    gc.disable()
    try:
        before = len(gc.get_objects())
        del svc
        # the service and its dests go by reference counting alone
        assert len(gc.get_objects()) <= before - 2
    finally:
        gc.enable()


def test_the_file_is_parsed_as_it_is_read(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """At 20,000 Services the whole text and its list of lines were 20 MB of serve's peak;
    read line by line, the peak is the counts themselves (about 5.2 MB for 22,000 services)."""
    import tracemalloc

    from agent.readers import ipvs_proc

    head = PROC.splitlines(keepends=True)[:3]
    body = []
    for i in range(22000):
        body.append(f"TCP  0A{i:06X}:0050 rr\n")
        body += [
            f"  -> 0A{i * 3 + j:06X}:1F90      Masq    1      0          0\n" for j in range(3)
        ]
    path = tmp_path / "ip_vs"
    path.write_text("".join(head + body))
    del body
    monkeypatch.setattr(ipvs_proc, "PROC_IPVS", path)
    tracemalloc.start()
    try:
        counts = ipvs_proc.read_proc_dest_counts()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(counts) == 22000 and set(counts.values()) == {3}
    assert path.stat().st_size > 3_500_000
    # the text alone is 3.9 MB and its lines 9 MB more: read whole, the peak was 18.5 MB
    assert peak < 8_000_000, peak


def test_services_as_serve_reads_them_without_netlink() -> None:
    """serve's scrapes take the virtual servers from /proc/net/ip_vs (no netlink dump):
    family, protocol, address, port, scheduler, flags as listed, and the real-server count."""
    from agent.readers.ipvs import proc_services
    from agent.snapshot import IpvsService

    text = PROC.split("FWM  00000064")[0] + (
        "TCP  C0A8010A:7580 wlc persistent 300 FFFFFF00\n"
        "  -> 0AF40005:1F90      Route   2      4          7\n"
        "  -> 0AF40006:1F90      Tunnel  1      0          0\n"
        "UDP  0A600016:13CD rr ops \n"
    )
    parsed = proc_services(io.StringIO(text))
    assert parsed is not None
    services, counts = parsed
    assert services == [
        IpvsService(4, "TCP", "10.96.0.1", 443, None, "rr", 0x2, 0),
        IpvsService(4, "UDP", "10.96.0.10", 53, None, "rr", 0x3, 0),
        IpvsService(4, "SCTP", "172.16.0.5", 9000, None, "rr", 0x2, 0),
        IpvsService(6, "TCP", "fd00:96::1", 443, None, "rr", 0x2, 0),
        IpvsService(4, "TCP", "192.168.1.10", 30080, None, "wlc", 0x3, 0),
        IpvsService(4, "UDP", "10.96.0.22", 5069, None, "rr", 0x6, 0),
    ]
    assert counts == [2, 1, 0, 1, 2, 0]
    assert proc_services(io.StringIO(PROC.split("TCP  0A")[0])) == ([], [])


def test_services_proc_cannot_name_exactly_send_the_read_to_netlink() -> None:
    from agent.readers.ipvs import proc_services

    # a fwmark service: its line carries no family
    assert proc_services(io.StringIO(PROC)) is None
    # a key listed twice: the table changed while it was read
    head, _ = PROC.split("TCP  0A600001:01BB rr\n")
    twice = head + "TCP  0A600001:01BB rr\n" + "TCP  0A600001:01BB rr\n"
    assert proc_services(io.StringIO(twice)) is None
    # a word the kernel does not print for a protocol (a changed or damaged format)
    assert proc_services(io.StringIO(head + "ERR!  0A600001:01BB rr\n")) is None


def test_protocols_without_a_model_name_are_keyed_by_their_number() -> None:
    """IPVS balances AH and ESP too; the model names only TCP, UDP and SCTP, and /proc's
    line for AH (ip_vs_proto_name prints IP_51) must meet netlink's protocol 51 under one key."""
    from agent.readers.ipvs import proc_services

    head = PROC.split("TCP  0A600001:01BB rr\n")[0]
    lines = head + "IP_51  0A600001:0000 rr\n  -> 0AF40003:0000      Route   1      0          0\n"
    assert proc_dest_counts(io.StringIO(lines)) == {(51, "10.96.0.1", 0): 1}
    got = proc_services(io.StringIO(lines))
    assert got is not None and [(s.protocol, s.address, s.port) for s in got[0]] == [
        (51, "10.96.0.1", 0)
    ]
    assert proc_dest_counts(io.StringIO(head + "ERR!  0A600001:01BB rr\n")) == {}


def test_a_listing_another_disagrees_with_or_the_ipv4_count_disproves_is_read_again() -> None:
    import pytest

    from agent.readers.ipvs import _check_dump
    from agent.readers.netlink import DumpInterrupted
    from agent.snapshot import IpvsService

    v4 = [IpvsService(4, "TCP", f"10.96.0.{i}", 80, None, "rr", 2, 0) for i in range(3)]
    v6 = [IpvsService(6, "TCP", "fd00:96::1", 80, None, "rr", 2, 0)]
    _check_dump(v4 + v6, v6 + v4, 3, 3)  # the count is of IPv4 services only
    _check_dump(v4 + v6, v4 + v6, None, None)  # the kernel cannot count: two listings agree
    for again, before, after, said in (
        (v4, 3, 3, "disagree"),  # the second skipped the IPv6 one
        (v4 + v6 + v6, 3, 3, "disagree"),
        (v4 + v6, 4, 4, "the kernel counts"),  # both skipped the same IPv4 one
        (v4 + v6, 3, 4, "the kernel counts"),  # one added during the reads
    ):
        with pytest.raises(DumpInterrupted, match=said):
            _check_dump(v4 + v6, again, before, after)
    with pytest.raises(DumpInterrupted, match="twice"):
        _check_dump(v4 + v4[:1], v4, 3, 3)


def test_a_dump_lacking_a_listed_service_is_read_again_in_linear_time() -> None:
    """20,000 Services checked well within a second (the first version rebuilt the dump's
    keys for every listed key: about 20 s at 10,000)."""
    import time

    import pytest

    from agent.readers.ipvs import _check_listed, proc_key
    from agent.readers.netlink import DumpInterrupted
    from agent.snapshot import IpvsService

    found = [
        IpvsService(4, "TCP", f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", 80, None, "rr", 1, 0)
        for i in range(20_000)
    ]
    listed = {proc_key(s): (1, 0, 0) for s in found}
    started = time.perf_counter()
    _check_listed(found, listed)
    assert time.perf_counter() - started < 1.0
    with pytest.raises(DumpInterrupted, match="missed a virtual server"):
        _check_listed(found[1:], listed)
    _check_listed(found, {})  # /proc may list fewer (it skips under churn): not this check's
