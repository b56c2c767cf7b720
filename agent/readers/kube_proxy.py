"""kube-proxy's own word: /proxyMode and /metrics (:10249), /healthz (:10256).

Unreachable is `absent` (kube-proxy may simply not run here); an answer that cannot be
understood is `error`. Neither raises.
"""

from __future__ import annotations

import json
import re
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agent.readers._timing import Absent, timed
from agent.readers.urls import split_url
from agent.snapshot import KubeProxy, KubeProxyHealth, KubeProxyMetrics

MODES = ("ipvs", "iptables", "nftables", "kernelspace")
_MAX_BODY = 16 * 1024 * 1024


class Garbage(ValueError):
    """kube-proxy answered, but not in a form kube-proxy uses."""


def _get(url: str, timeout: float) -> tuple[int, bytes]:
    """GET over a plain socket, HTTP/1.1 with Connection: close; any status is returned with
    its body. urllib.request, http.client and the idna codec they pull in were a third of a
    cold audit's imports in the benchmark's VM, for four GETs to the node itself. Never
    through a proxy: kube-proxy listens on the node, an HTTP(S)_PROXY from the pod's
    environment must not send these requests elsewhere. https:// goes through urllib."""
    try:
        u = split_url(url)
    except ValueError as exc:
        raise Absent(f"{url} unreachable: {exc}") from exc
    if u.scheme != "http":
        return _get_urllib(url, timeout)
    try:
        host, port, path = u.host, u.port or 80, u.target
        # bytes: a str host makes getaddrinfo import the idna codec
        with socket.create_connection((host.encode(), port), timeout=timeout) as sock:  # type: ignore[arg-type]
            sock.sendall(
                f"GET {path} HTTP/1.1\r\nHost: {u.netloc}\r\nUser-Agent: ipvs-leftovers\r\n"
                "Accept: */*\r\nConnection: close\r\n\r\n".encode()
            )
            data = bytearray()
            while len(data) <= _MAX_BODY + 65536:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    except (OSError, UnicodeError, ValueError) as exc:
        raise Absent(f"{url} unreachable: {exc}") from exc
    return _response(url, bytes(data))


def _response(url: str, data: bytes) -> tuple[int, bytes]:
    head, sep, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.split(b"\r\n")
    words = status_line.split(None, 2)
    if not sep or len(words) < 2 or not words[0].startswith(b"HTTP/") or not words[1].isdigit():
        raise Absent(f"{url} unreachable: not an HTTP answer ({status_line[:40]!r})")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip().lower()
    if b"chunked" in headers.get(b"transfer-encoding", b""):
        body = _dechunk(body)
    elif headers.get(b"content-length", b"").isdigit():
        body = body[: int(headers[b"content-length"])]
    return int(words[1]), body[:_MAX_BODY]


def _dechunk(body: bytes) -> bytes:
    out = bytearray()
    offset = 0
    while True:
        end = body.find(b"\r\n", offset)
        if end < 0:
            break
        word = body[offset:end].split(b";", 1)[0].strip() or b"0"
        # hex digits only: int() also takes "-4" (offset went back: an endless loop), "0x", "_"
        if len(word) > 16 or word.strip(b"0123456789abcdefABCDEF"):
            raise Garbage(f"not a chunk size: {word[:20]!r}")
        size = int(word, 16)
        if size == 0:
            break
        out += body[end + 2 : end + 2 + size]
        offset = end + 2 + size + 2
    return bytes(out)


def _get_urllib(url: str, timeout: float) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as resp:
            return int(resp.status), resp.read(_MAX_BODY)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(_MAX_BODY)
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        raise Absent(f"{url} unreachable: {reason}") from exc


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
    try:
        samples = parse_samples(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise Garbage(f"/metrics is not Prometheus text: {exc}") from exc
    names = {s.name for s in samples}
    if not any(n.startswith("kubeproxy_") for n in names):
        raise Garbage("/metrics has no kubeproxy_ series")
    last_sync: dict[str, float] = {}
    nft_failures: float | None = None
    localhost = invalid = None
    for s in samples:
        if s.name == "kubeproxy_sync_proxy_rules_last_timestamp_seconds":
            last_sync[s.labels.get("ip_family", "")] = float(s.value)
        elif s.name == "kubeproxy_sync_proxy_rules_nftables_sync_failures_total":
            nft_failures = (nft_failures or 0.0) + float(s.value)
        elif s.name == "kubeproxy_iptables_localhost_nodeports_accepted_packets_total":
            localhost = (localhost or 0.0) + float(s.value)
        elif s.name == "kubeproxy_iptables_ct_state_invalid_dropped_packets_total":
            invalid = (invalid or 0.0) + float(s.value)
    return KubeProxyMetrics(
        last_sync=last_sync,
        nftables_sync_failures=nft_failures,
        nftables_series=any(n.startswith("kubeproxy_sync_proxy_rules_nftables_") for n in names),
        ipvs_series=False,  # ipvs mode registers no series of its own
        iptables_series=any(n.startswith("kubeproxy_iptables_") for n in names),
        localhost_nodeport_packets=localhost,
        ct_state_invalid_dropped=invalid,
    )


# Go's %q of a time.Time: "2024-05-25 03:22:43.5 +0000 UTC m=+12.3"
_GO_TIME = re.compile(
    r"^(\d{4}-\d{2}-\d{2}) (\d{2}:\d{2}:\d{2})(?:\.(\d+))? ([+-]\d{4})(?: \S+)?(?: m=[+-][\d.]+)?$"
)
_RFC3339 = re.compile(r"^(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2}:\d{2})(?:\.(\d+))?(Z|[+-]\d{2}:\d{2})$")


def parse_timestamp(text: str) -> float:
    """Unix seconds from either timestamp format kube-proxy's healthz has used."""
    m = _RFC3339.match(text) or _GO_TIME.match(text)
    if not m:
        raise Garbage(f"unknown timestamp format {text[:40]!r}")
    day, clock, frac, zone = m.groups()
    zone = "+00:00" if zone == "Z" else zone
    if ":" not in zone:
        zone = f"{zone[:3]}:{zone[3:]}"
    try:  # the regexes take any digits: month 13, hour 25, year 9999 at -23:59
        base = datetime.fromisoformat(f"{day}T{clock}{zone}").astimezone(UTC).timestamp()
    except (ValueError, OverflowError) as exc:
        raise Garbage(f"not a time {text[:40]!r}: {exc}") from exc
    return base + (float(f"0.{frac}") if frac else 0.0)


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
    families: dict[str, float | None] = {}
    status_doc = doc.get("status") or {}
    if not isinstance(status_doc, dict):
        raise Garbage(f"{path} has a status that is not an object")
    for fam, st in status_doc.items():
        stamp = st.get("lastUpdated") if isinstance(st, dict) else None
        families[str(fam)] = parse_timestamp(stamp) if isinstance(stamp, str) else None
    current = doc.get("currentTime")
    return KubeProxyHealth(
        http_status=status,
        healthy=status == 200 and doc.get("healthy", True) is not False,
        last_updated=parse_timestamp(str(doc["lastUpdated"])),
        current_time=parse_timestamp(current) if isinstance(current, str) else None,
        families=families,
        node_eligible=eligible if isinstance(eligible := doc.get("nodeEligible"), bool) else None,
    )


def read(metrics_url: str, healthz_url: str, timeout: float) -> KubeProxy:
    base = metrics_url.rstrip("/")
    return KubeProxy(
        proxy_mode=timed(lambda: parse_proxy_mode(*_get(f"{base}/proxyMode", timeout)), None),
        metrics=timed(lambda: parse_metrics(_get(f"{base}/metrics", timeout)[1]), None),
        healthz=timed(lambda: parse_healthz(*_get(healthz_url, timeout)), None),
        read_at=time.time(),
        livez=timed(lambda: parse_livez(*_get(livez_url(healthz_url), timeout)), None),
    )
