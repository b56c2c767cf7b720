"""kube-proxy's client: one deadline for a whole answer, size caps, and
/metrics parsed as it arrives. A real server on loopback, one answer per connection."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from agent.readers import kube_proxy as kp
from agent.readers._timing import Absent


def _serve(*answers: bytes, pause: float = 0.0) -> str:
    """A loopback server giving each connection the next answer, `pause` seconds between the
    bytes of its body when set; returns its base URL."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)

    def run() -> None:
        for answer in answers:
            conn, _ = srv.accept()
            with conn:
                conn.recv(65536)
                try:
                    if pause:  # the status line and headers at once, then the body dripping
                        head, sep, body = answer.partition(b"\r\n\r\n")
                        conn.sendall(head + sep)
                        for i in range(len(body)):
                            conn.sendall(body[i : i + 1])
                            time.sleep(pause)
                    else:
                        conn.sendall(answer)
                except OSError:
                    pass
        srv.close()

    threading.Thread(target=run, daemon=True).start()
    return f"http://127.0.0.1:{srv.getsockname()[1]}"


def test_a_dripping_body_is_cut_at_the_deadline() -> None:
    url = _serve(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nnftables", pause=0.3)
    start = time.monotonic()
    with pytest.raises(kp.Late, match="not complete by the deadline"):
        kp._get(f"{url}/proxyMode", 1.0)
    assert time.monotonic() - start < 1.5


def test_no_answer_at_all_is_late_and_no_server_is_absent() -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)  # accepts (in the kernel), never answers
    with pytest.raises(kp.Late, match="did not answer by the deadline"):
        kp._get(f"http://127.0.0.1:{srv.getsockname()[1]}/x", 0.3)
    port = srv.getsockname()[1]
    srv.close()
    with pytest.raises(Absent, match="unreachable"):
        kp._get(f"http://127.0.0.1:{port}/x", 0.3)


def test_sizes_over_the_cap_are_refused_sized_or_chunked() -> None:
    url = _serve(
        b"HTTP/1.1 200 OK\r\nContent-Length: 70000\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"8000\r\n"
        + b"a" * 32768
        + b"\r\n" * 3,
    )
    with pytest.raises(kp.Garbage, match="70000 bytes is over 65536"):
        kp._get(f"{url}/a", 2)
    with pytest.raises(kp.Garbage, match="over 16384 bytes"):
        kp._get(f"{url}/b", 2, limit=16384)


def test_control_characters_are_never_sent() -> None:
    with pytest.raises(kp.Garbage, match="control character"):
        kp._get("http://127.0.0.1:1/x\r\nX-Injected: 1", 1)


def _chunks(text: bytes, size: int) -> Iterator[bytes]:
    return iter([text[i : i + size] for i in range(0, len(text), size)])


METRICS = (
    b"# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds x\n"
    b'kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7e+09\n'
    b'kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 1.8e+09\n'
    b'kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"} 2\n'
    b'kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv6"} 1\n'
    b"go_goroutines 5\n"
    b"kubeproxy_iptables_ct_state_invalid_dropped_packets_total 7"  # no final newline
)


@pytest.mark.parametrize("size", [1, 3, 17, 4096])
def test_metrics_read_as_they_arrive_whatever_the_chunking(size: int) -> None:
    m = kp.read_metrics(_chunks(METRICS, size))
    assert m == kp.parse_metrics(METRICS)
    assert m.last_sync == {"ipv4": 1.7e9, "ipv6": 1.8e9}
    assert m.nftables_sync_failures == 3.0 and m.ct_state_invalid_dropped == 7.0
    assert m.nftables_series and m.iptables_series


def test_a_line_longer_than_a_mebibyte_is_garbage() -> None:
    with pytest.raises(kp.Garbage, match="line over"):
        kp.read_metrics(iter([b"kubeproxy_x 1\n", b"a" * (1024 * 1024 + 2)]))


def test_the_four_endpoints_share_one_deadline() -> None:
    """Each answer's body drips for 2.4 s; with --timeout 1 the whole reading takes about 1 s,
    not 4 times 2.4."""
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nnftables"
    url = _serve(*[answer] * 4, pause=0.3)
    start = time.monotonic()
    got = kp.read(url, f"{url}/healthz", 1.0)
    took = time.monotonic() - start
    assert took < 1.8, took
    assert got.proxy_mode.status == "error" and "deadline" in (got.proxy_mode.error or "")
