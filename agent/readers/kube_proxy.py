"""kube-proxy's own word: /proxyMode, /metrics and /configz (:10249), /healthz (:10256).

Unreachable is `absent` (kube-proxy may simply not run here); an answer that cannot be
understood is `error`. Neither raises.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from agent import names
from agent.readers._timing import Absent, timed
from agent.readers.configz import parse_configz
from agent.readers.timestamps import Garbage, parse_timestamp
from agent.readers.urls import split_url
from agent.snapshot import (
    Family,
    KubeProxy,
    KubeProxyHealth,
    KubeProxyMetrics,
    Reading,
    as_family,
)

R = TypeVar("R")

MODES = ("ipvs", "iptables", "nftables", "kernelspace")
# What each answer may hold. /metrics is parsed as it arrives (never held whole): a 200 MB
# /metrics took serve to 267 MB RSS; past the cap the source is an error. kube-proxy's
# own /metrics is tens of KiB, /proxyMode one word, /healthz and /livez one small JSON object.
METRICS_LIMIT = 16 * 1024 * 1024
SMALL_LIMIT = 64 * 1024
HEADER_LIMIT = 64 * 1024
_LINE_LIMIT = 1024 * 1024  # one line of Prometheus text
# A reader thread still running this long after the shared deadline is abandoned (its socket
# operations are themselves bounded by the deadline; this covers what is not, a TLS handshake).
_JOIN_GRACE = 0.5


def ip_family(text: str) -> Family | None:
    """The model's family for kube-proxy's spelling (IPv4, IPv6); None for any other."""
    known = names.KUBE_PROXY_IP_FAMILIES.get(text)
    return as_family(known) if known else None


class Late(Exception):
    """kube-proxy began an answer but did not finish it by the deadline."""


def _unsafe(url: str) -> bool:
    """A control character, a space or a non-ASCII character: never put on the wire (a CR/LF
    would add headers or a second request). The command line refuses such URLs already."""
    return any(c <= " " or c >= "\x7f" for c in url)


def _get(url: str, timeout: float, limit: int = SMALL_LIMIT) -> tuple[int, bytes]:
    """GET `url` within `timeout` seconds for the whole answer; (status, body)."""
    return _fetch(url, time.monotonic() + timeout, limit, _join)


def _fetch(
    url: str, deadline: float, limit: int, consume: Callable[[Iterator[bytes]], R]
) -> tuple[int, R]:
    """GET over a plain socket, HTTP/1.1 with Connection: close; any status is returned with
    what `consume` makes of its body, read as it arrives. urllib.request, http.client and the
    idna codec they pull in were a third of a cold audit's imports in the benchmark's VM, for
    four GETs to the node itself. Never through a proxy: kube-proxy listens on the node, an
    HTTP(S)_PROXY from the pod's environment must not send these requests elsewhere.

    `deadline` (time.monotonic()) bounds the whole answer, not each read: a kube-proxy that
    drips its body a byte a second is cut there. No connection by then is `absent`;
    a request accepted and not answered by then, or an answer not finished by then (Late), or
    one over `limit` bytes (Garbage), is an error.
    """
    if _unsafe(url):
        raise Garbage(f"{url!r} holds a control character or space; not sent")
    try:
        u = split_url(url)
    except ValueError as exc:
        raise Absent(f"{url} unreachable: {exc}") from exc
    if u.scheme not in ("http", "https"):
        raise Absent(f"{url} unreachable: not an http(s) URL")
    try:
        host, port = u.host, u.port or (443 if u.scheme == "https" else 80)
        # bytes: a str host makes getaddrinfo import the idna codec
        sock = socket.create_connection((host.encode(), port), timeout=_left(deadline))  # type: ignore[arg-type]
    except (OSError, UnicodeError, ValueError) as exc:
        raise Absent(f"{url} unreachable: {exc}") from exc
    try:
        if u.scheme == "https":
            import ssl

            sock.settimeout(_left(deadline))
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        sock.sendall(
            f"GET {u.target} HTTP/1.1\r\nHost: {u.netloc}\r\nUser-Agent: ipvs-leftovers\r\n"
            "Accept: */*\r\nConnection: close\r\n\r\n".encode()
        )
        conn = _Conn(sock, deadline)
        try:
            status_line = conn.line(HEADER_LIMIT)
        except TimeoutError as exc:  # connected, asked, and no answer: a stuck kube-proxy
            raise Late(f"{url} accepted the request but did not answer by the deadline") from exc
        except OSError as exc:  # reset: not kube-proxy's server
            raise Absent(f"{url} unreachable: {exc}") from exc
        status, headers = _head(url, status_line, conn)
        try:
            return status, consume(_body(url, conn, headers, limit))
        except OSError as exc:
            raise Late(
                f"{url} answered HTTP {status} but its body was not complete by the deadline "
                f"({conn.total} bytes read): {exc or 'timed out'}"
            ) from exc
    except OSError as exc:  # the TLS handshake or the request itself
        raise Absent(f"{url} unreachable: {exc or 'timed out'}") from exc
    finally:
        sock.close()


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    return left


class _Conn:
    """A socket read in chunks, each recv given only what is left of the deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline = sock, deadline
        self.buf = bytearray()
        self.total = 0

    def _fill(self) -> bool:
        self.sock.settimeout(_left(self.deadline))
        chunk = self.sock.recv(65536)
        self.buf += chunk
        self.total += len(chunk)
        return bool(chunk)

    def line(self, limit: int) -> bytes:
        """Up to and with the next LF; what is left at the end; Garbage past `limit`."""
        start = 0
        while True:
            end = self.buf.find(b"\n", start)
            if end >= 0:
                out = bytes(self.buf[: end + 1])
                del self.buf[: end + 1]
                return out
            if len(self.buf) > limit:
                raise Garbage(f"a header or chunk line longer than {limit} bytes")
            start = len(self.buf)
            if not self._fill():
                out = bytes(self.buf)
                self.buf.clear()
                return out

    def some(self, most: int) -> bytes:
        """At most `most` bytes, b"" at the end."""
        if not self.buf and not self._fill():
            return b""
        out = bytes(self.buf[:most])
        del self.buf[:most]
        return out


def _head(url: str, status_line: bytes, conn: _Conn) -> tuple[int, dict[bytes, bytes]]:
    words = status_line.split(None, 2)
    if len(words) < 2 or not words[0].startswith(b"HTTP/") or not words[1].isdigit():
        raise Absent(f"{url} unreachable: not an HTTP answer ({status_line[:40]!r})")
    headers: dict[bytes, bytes] = {}
    size = len(status_line)
    while True:
        try:
            line = conn.line(HEADER_LIMIT)
        except OSError as exc:
            raise Late(f"{url}: headers not complete by the deadline: {exc}") from exc
        size += len(line)
        if size > HEADER_LIMIT:
            raise Garbage(f"{url}: headers over {HEADER_LIMIT} bytes")
        line = line.rstrip(b"\r\n")
        if not line:
            return int(words[1]), headers
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip().lower()


def _body(url: str, conn: _Conn, headers: dict[bytes, bytes], limit: int) -> Iterator[bytes]:
    """The body's bytes as they arrive: chunked, sized by Content-Length, or to the close."""
    over = f"{url}: answer over {limit} bytes; not read further"
    seen = 0
    if b"chunked" in headers.get(b"transfer-encoding", b""):
        while True:
            size_text = conn.line(1024).split(b";", 1)[0].strip() or b"0"
            # hex digits only: int() also takes "-4" (a negative size never ends), "0x", "_"
            if len(size_text) > 16 or size_text.strip(b"0123456789abcdefABCDEF"):
                raise Garbage(f"{url}: bad chunk size {size_text[:20]!r}")
            size = int(size_text, 16)
            if size == 0:
                return
            seen += size
            if seen > limit:
                raise Garbage(over)
            while size:
                part = conn.some(size)
                if not part:
                    return
                size -= len(part)
                yield part
            conn.line(16)  # the chunk's CRLF
    length_text = headers.get(b"content-length", b"")
    left = int(length_text) if length_text.isdigit() else None
    if left is not None and left > limit:
        raise Garbage(f"{url}: answer of {left} bytes is over {limit}; not read")
    while left is None or left > 0:
        part = conn.some(65536 if left is None else min(left, 65536))
        if not part:
            return
        seen += len(part)
        if seen > limit:
            raise Garbage(over)
        if left is not None:
            left -= len(part)
        yield part


def parse_proxy_mode(status: int, body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    if status != 200 or text not in MODES:
        raise Garbage(f"/proxyMode answered HTTP {status} {text[:40]!r}, not a proxy mode")
    return text


# One sample line of the Prometheus text format: name, optional {labels}, value, optional
# timestamp. A parser of its own: importing prometheus_client.parser cost 1.1 s of a cold
# audit under the benchmark's VM (about 40 ms on a node) for the four series read here.
# The spaces after a label belong to its optional comma only: with `\s*,?` there, the spaces
# between labels could be split two ways each and a line left open backtracked exponentially
# (a 100-byte line took 89 s; tests/fault/test_fuzz_parsers.py).
_SAMPLE = re.compile(
    r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{((?:\s*[a-zA-Z_][a-zA-Z0-9_]*\s*=\s*"(?:[^"\\\n]|\\.)*"(?:\s*,)?)*)\s*\})?'
    r"\s+(\S+)(?:\s+-?\d+)?\s*$"
)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\\n]|\\.)*)"')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass(frozen=True)
class Sample:
    """One sample of a Prometheus text exposition."""

    name: str
    labels: dict[str, str]
    value: float


def parse_samples(text: str) -> list[Sample]:
    """The samples of a Prometheus text exposition; ValueError on a line that is not one."""
    out = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _SAMPLE.match(line.strip())
        if m is None:
            raise ValueError(f"not a sample line: {line[:60]!r}")
        name, labels, value = m.groups()
        found = {
            k: re.sub(r"\\[\\\"n]", lambda e: _UNESCAPE[e.group()], v)
            for k, v in _LABEL.findall(labels or "")
        }
        out.append(Sample(name, found, float(value)))
    return out


def parse_metrics(body: bytes) -> KubeProxyMetrics:
    return read_metrics(iter((body,)))


_WANTED = (
    "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
    "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
    "kubeproxy_iptables_localhost_nodeports_accepted_packets_total",
    "kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
    "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
)


class _Metrics:
    """What the agent uses of a /metrics text, gathered a line at a time: every line is
    checked to be a sample, but only the few series above are kept."""

    def __init__(self) -> None:
        self.kubeproxy = self.nftables = self.iptables = False
        self.last_sync: dict[Family | None, float] = {}
        self.last_queued: dict[Family | None, float] = {}
        self.failures: dict[Family | None, float] = {}
        self.sums: dict[str, float] = {}
        self.ipvs_gate: tuple[float, str] | None = None

    def line(self, raw: bytes) -> None:
        try:
            line = raw.decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            raise Garbage(f"/metrics is not Prometheus text: {exc}") from exc
        if not line or line.startswith("#"):
            return
        m = _SAMPLE.match(line)
        if m is None:
            raise Garbage(f"/metrics is not Prometheus text: not a sample line: {line[:60]!r}")
        name = m.group(1)
        if name == names.FEATURE_ENABLED_SERIES:
            self._feature(m)
            return
        if not name.startswith("kubeproxy_"):
            return
        self.kubeproxy = True
        self.nftables = self.nftables or name.startswith("kubeproxy_sync_proxy_rules_nftables_")
        self.iptables = self.iptables or name.startswith("kubeproxy_iptables_")
        if name not in _WANTED:
            return
        value = _value(m.group(3))
        by_family = {
            _WANTED[0]: self.last_sync,
            _WANTED[1]: self.failures,
            _WANTED[4]: self.last_queued,
        }.get(name)
        if by_family is not None:
            labels = dict(_LABEL.findall(m.group(2) or ""))
            if not labels.get("ip_family"):
                by_family[None] = value
            elif (fam := ip_family(labels["ip_family"])) is not None:  # kube-proxy has no other
                by_family[fam] = value
        if name not in (_WANTED[0], _WANTED[4]):
            self.sums[name] = self.sums.get(name, 0.0) + value

    def _feature(self, m: re.Match[str]) -> None:
        """kubernetes_feature_enabled{name="KubeProxyIPVS",stage="DEPRECATED"} (v1.37+)."""
        labels = dict(_LABEL.findall(m.group(2) or ""))
        if labels.get("name") == names.IPVS_FEATURE_GATE:
            self.ipvs_gate = (_value(m.group(3)), labels.get("stage", ""))

    def result(self) -> KubeProxyMetrics:
        if not self.kubeproxy:
            raise Garbage("/metrics has no kubeproxy_ series")
        return KubeProxyMetrics(
            last_sync=self.last_sync,
            last_queued=self.last_queued,
            sync_failures=self.failures,
            nftables_sync_failures=self.sums.get(_WANTED[1]),
            nftables_series=self.nftables,
            ipvs_series=False,  # ipvs mode registers no series of its own
            iptables_series=self.iptables,
            localhost_nodeport_packets=self.sums.get(_WANTED[2]),
            ct_state_invalid_dropped=self.sums.get(_WANTED[3]),
            ipvs_feature_gate=self.ipvs_gate,
        )


def _value(text: str) -> float:
    try:
        return float(text)
    except ValueError as exc:
        raise Garbage(f"/metrics is not Prometheus text: {exc}") from exc


def read_metrics(chunks: Iterator[bytes]) -> KubeProxyMetrics:
    """/metrics from its body's chunks as they arrive; memory bounded by one line."""
    parsed = _Metrics()
    tail = b""
    for chunk in chunks:
        data = tail + chunk if tail else chunk
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            parsed.line(data[start:end])
            start = end + 1
        tail = data[start:]
        if len(tail) > _LINE_LIMIT:
            raise Garbage(f"/metrics has a line over {_LINE_LIMIT} bytes")
    if tail:
        parsed.line(tail)
    return parsed.result()


def livez_url(healthz_url: str) -> str:
    """kube-proxy serves /livez beside /healthz on the same health server."""
    base = healthz_url.rstrip("/")
    return (base[: -len("/healthz")] if base.endswith("/healthz") else base) + "/livez"


def parse_livez(status: int, body: bytes) -> KubeProxyHealth:
    if status == 404:  # a release before /livez existed: the caller falls back on /healthz
        raise Absent("/livez not served by this kube-proxy release")
    return parse_healthz(status, body, "/livez")


def parse_healthz(status: int, body: bytes, path: str = "/healthz") -> KubeProxyHealth:
    try:
        doc: Any = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: [[[[...
        raise Garbage(f"{path} is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or "lastUpdated" not in doc or status not in (200, 503):
        raise Garbage(f"{path} answered HTTP {status} without lastUpdated")
    families: dict[Family, float | None] = {}
    status_doc = doc.get("status") or {}
    if not isinstance(status_doc, dict):
        raise Garbage(f"{path} has a status that is not an object")
    for fam, st in status_doc.items():
        stamp = st.get("lastUpdated") if isinstance(st, dict) else None
        if (known := ip_family(str(fam))) is not None:  # kube-proxy has no other
            families[known] = parse_timestamp(stamp) if isinstance(stamp, str) else None
    current = doc.get("currentTime")
    return KubeProxyHealth(
        http_status=status,
        healthy=status == 200 and doc.get("healthy", True) is not False,
        last_updated=parse_timestamp(str(doc["lastUpdated"])),
        current_time=parse_timestamp(current) if isinstance(current, str) else None,
        families=families,
        node_eligible=eligible if isinstance(eligible := doc.get("nodeEligible"), bool) else None,
    )


def read(
    metrics_url: str, healthz_url: str, timeout: float, deadline: float | None = None
) -> KubeProxy:
    """kube-proxy's four endpoints, read at once, each answer whole by one deadline: `timeout`
    seconds from now, or `deadline` (time.monotonic()) if that is sooner. They were read one
    after another, each with a per-read timeout: a stuck kube-proxy made serve miss the scrape
    deadline, and one dripping its answers held a cleanup for minutes."""
    started = time.monotonic()
    end = started + timeout if deadline is None else min(started + timeout, deadline)
    if end <= started:  # serve's scrape deadline passed while the kernel was read
        gone: Reading[Any] = Reading("error", None, "not read: the scrape deadline had passed")
        return KubeProxy(gone, gone, gone, time.time(), livez=gone)
    base = metrics_url.rstrip("/")
    reads: dict[str, Callable[[], Any]] = {
        "proxy_mode": lambda: parse_proxy_mode(*_small(f"{base}/proxyMode", end)),
        "metrics": lambda: _fetch(f"{base}/metrics", end, METRICS_LIMIT, read_metrics)[1],
        "healthz": lambda: parse_healthz(*_small(healthz_url, end)),
        "livez": lambda: parse_livez(*_small(livez_url(healthz_url), end)),
        "configz": lambda: parse_configz(*_small(f"{base}/configz", end)),
    }
    got: dict[str, Reading[Any]] = {}
    threads = []
    for name, fn in reads.items():

        def run(name: str = name, fn: Callable[[], Any] = fn) -> None:
            got[name] = timed(fn, None)

        thread = threading.Thread(target=run, name=f"kube-proxy-{name}", daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(max(end - time.monotonic(), 0.0) + _JOIN_GRACE)
    late = f"no answer within {end - started:.3g}s"
    readings = {
        name: got.get(name) or Reading("error", None, late, time.monotonic() - started)
        for name in reads
    }
    return KubeProxy(
        proxy_mode=readings["proxy_mode"],
        metrics=readings["metrics"],
        healthz=readings["healthz"],
        read_at=time.time(),
        livez=readings["livez"],
        configz=readings["configz"],
    )


def _join(chunks: Iterator[bytes]) -> bytes:
    return b"".join(chunks)


def _small(url: str, deadline: float) -> tuple[int, bytes]:
    return _fetch(url, deadline, SMALL_LIMIT, _join)
