"""/proc/net/ip_vs: real servers counted per virtual server, as the kernel prints them."""

from __future__ import annotations

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
    assert proc_dest_counts(PROC) == {
        ("TCP", "10.96.0.1", 443): 2,
        ("UDP", "10.96.0.10", 53): 1,
        ("SCTP", "172.16.0.5", 9000): 0,
        ("TCP", "fd00:96::1", 443): 1,
        ("FWM", 100): 1,
    }


def test_an_empty_table() -> None:
    assert proc_dest_counts(PROC.split("TCP  0A")[0]) == {}
