"""A stand-in for kube-proxy's metrics (:10249) and healthz (:10256) servers (docs/kube-proxy-names.md#kube-proxys-endpoints-and-metrics).

Run inside a namespace: python -m lab.fake_kube_proxy --state-file PATH. The JSON state file is
re-read on every request, so a test flips behaviour by rewriting it:
  {"mode": "nftables"|"ipvs"|"iptables", "families": ["IPv4", "IPv6"], "healthy": true,
   "last_sync_age": 5.0, "healthz_format": "json"|"old"|"oldest", "garbage": false,
   "sync_failures": 0, "node_eligible": true, "release": null|"v1.30.3"}
node_eligible false is a node being deleted: /healthz answers 503, /livez ignores it (as
kube-proxy's proxier_health.go). The "oldest" format is a release before /livez (404).
"release": "v1.30.3" serves what real kube-proxy v1.30.3 serves (tests/data/kube-proxy-v1.30.3):
/healthz in the old Go-time format with nodeEligible, /livez without it, and /metrics without
ip_family labels, without any nftables series, with its iptables-mode gauges.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

DEFAULT_STATE: dict[str, Any] = {
    "mode": "nftables",
    "families": ["IPv4"],
    "healthy": True,
    "last_sync_age": 5.0,
    "healthz_format": "json",
    "garbage": False,
    "sync_failures": 0,
    "node_eligible": True,
    "release": None,
}
_STARTED = time.monotonic()


def load_state(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    return {**DEFAULT_STATE, **data}


def rfc3339nano(ts: float) -> str:
    # Go's time.RFC3339Nano: trailing zeros of the fraction dropped, "Z" for UTC.
    dt = datetime.fromtimestamp(ts, UTC)
    frac = f"{dt.microsecond:06d}".rstrip("0")
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + (f".{frac}" if frac else "") + "Z"


def go_time_string(ts: float) -> str:
    """time.Time.String() with a monotonic reading, as %q printed it in old kube-proxy."""
    dt = datetime.fromtimestamp(ts, UTC)
    frac = f"{dt.microsecond:06d}".rstrip("0")
    mono = ts - time.time() + time.monotonic() - _STARTED
    return (
        dt.strftime("%Y-%m-%d %H:%M:%S")
        + (f".{frac}" if frac else "")
        + f" +0000 UTC m={'-' if mono < 0 else '+'}{abs(mono):.9f}"  # Go's sign, then value
    )


def healthz_body(state: dict[str, Any], now: float, livez: bool = False) -> tuple[int, str]:
    eligible = bool(state.get("node_eligible", True))
    healthy = bool(state["healthy"]) and (eligible or livez)
    last = now - float(state["last_sync_age"])
    # On 200 kube-proxy reports lastUpdated as "now" for backward compatibility.
    shown = now if healthy else last
    fmt = state["healthz_format"]
    if livez and fmt == "old":
        fmt = "oldest"  # 1.30's /livez: the /healthz document without nodeEligible
    code = 200 if healthy else 503
    if fmt == "old":
        return code, (
            f'{{"lastUpdated": "{go_time_string(shown)}","currentTime": '
            f'"{go_time_string(now)}", "nodeEligible": {str(eligible).lower()}}}'
        )
    if fmt == "oldest":
        return code, (
            f'{{"lastUpdated": "{go_time_string(shown)}","currentTime": "{go_time_string(now)}"}}'
        )
    body = {
        "lastUpdated": rfc3339nano(shown),
        "currentTime": rfc3339nano(now),
        "nodeEligible": eligible,
        "healthy": healthy,
        "status": {
            fam: {"lastUpdated": rfc3339nano(last), "healthy": healthy} for fam in state["families"]
        },
    }
    return code, json.dumps(body, separators=(",", ":"))


def _counter(lines: list[str], name: str, help_: str, samples: list[tuple[str, float]]) -> None:
    lines += [f"# HELP {name} [ALPHA] {help_}", f"# TYPE {name} counter"]
    lines += [f"{name}{labels} {value:g}" for labels, value in samples]


def _gauge(lines: list[str], name: str, help_: str, samples: list[tuple[str, float]]) -> None:
    lines += [f"# HELP {name} [ALPHA] {help_}", f"# TYPE {name} gauge"]
    lines += [f"{name}{labels} {value!r}" for labels, value in samples]


def _histogram(lines: list[str], name: str, help_: str, fams: list[str]) -> None:
    lines += [f"# HELP {name} [ALPHA] {help_}", f"# TYPE {name} histogram"]
    buckets = [
        "0.001",
        "0.002",
        "0.004",
        "0.008",
        "0.016",
        "0.032",
        "0.064",
        "0.128",
        "0.256",
        "0.512",
        "1.024",
        "2.048",
        "4.096",
        "8.192",
        "16.384",
        "+Inf",
    ]
    for fam in fams:
        for b in buckets:
            count = 0 if float(b) < 0.008 else 42
            lines.append(f'{name}_bucket{{ip_family="{fam}",le="{b}"}} {count}')
        lines += [f'{name}_sum{{ip_family="{fam}"}} 0.53', f'{name}_count{{ip_family="{fam}"}} 42']


def _plain_histogram(lines: list[str], name: str, help_: str, count: int, total: float) -> None:
    """A histogram without labels (v1.30.3: one set of sync metrics for both families)."""
    lines += [f"# HELP {name} [ALPHA] {help_}", f"# TYPE {name} histogram"]
    bounds = ["0.001", "0.002", "0.004", "0.008", "0.016", "0.032", "0.064", "0.128", "0.256"]
    bounds += ["0.512", "1.024", "2.048", "4.096", "8.192", "16.384", "+Inf"]
    lines += [f'{name}_bucket{{le="{b}"}} {count if b == "+Inf" else 0}' for b in bounds]
    lines += [f"{name}_sum {total:g}", f"{name}_count {count}"]


def metrics_body_v1_30_3(state: dict[str, Any], now: float) -> str:
    """The series real kube-proxy v1.30.3 serves in each mode, as recorded."""
    mode = state["mode"]
    last = now - float(state["last_sync_age"])
    failures = float(state["sync_failures"])
    lines: list[str] = []
    _plain_histogram(
        lines,
        "kubeproxy_network_programming_duration_seconds",
        "In Cluster Network Programming Latency in seconds",
        0,
        0.0,
    )
    healthz = [('{code="200"}', 2.0)] + ([('{code="503"}', 1.0)] if not state["healthy"] else [])
    _counter(
        lines, "kubeproxy_proxy_healthz_total", "Cumulative proxy healthz HTTP status", healthz
    )
    _counter(
        lines,
        "kubeproxy_proxy_livez_total",
        "Cumulative proxy livez HTTP status",
        [('{code="200"}', 1.0)],
    )
    _plain_histogram(
        lines,
        "kubeproxy_sync_full_proxy_rules_duration_seconds",
        "SyncProxyRules latency in seconds for full resyncs",
        2,
        1.5,
    )
    _plain_histogram(
        lines,
        "kubeproxy_sync_partial_proxy_rules_duration_seconds",
        "SyncProxyRules latency in seconds for partial resyncs",
        0,
        0.0,
    )
    _plain_histogram(
        lines,
        "kubeproxy_sync_proxy_rules_duration_seconds",
        "SyncProxyRules latency in seconds",
        2,
        1.5,
    )
    _gauge(
        lines,
        "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
        "Pending proxy rules Endpoint changes",
        [("", 0.0)],
    )
    _counter(
        lines,
        "kubeproxy_sync_proxy_rules_endpoint_changes_total",
        "Cumulative proxy rules Endpoint changes",
        [("", 11.0)],
    )
    tables = [('{table="filter"}', 5.0), ('{table="nat"}', 122.0)]
    if mode == "iptables":
        _gauge(
            lines,
            "kubeproxy_sync_proxy_rules_iptables_last",
            "Number of iptables rules written by kube-proxy in last sync",
            tables,
        )
    _counter(
        lines,
        "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
        "Cumulative proxy iptables partial restore failures",
        [("", 0.0)],
    )
    _counter(
        lines,
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
        "Cumulative proxy iptables restore failures",
        [("", failures if mode != "nftables" else 0.0)],
    )
    if mode == "iptables":
        _gauge(
            lines,
            "kubeproxy_sync_proxy_rules_iptables_total",
            "Total number of iptables rules owned by kube-proxy",
            tables,
        )
    _gauge(
        lines,
        "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
        "The last time a sync of proxy rules was queued",
        [("", last)],
    )
    _gauge(
        lines,
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
        "The last time proxy rules were successfully synced",
        [("", last)],
    )
    _gauge(
        lines,
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
        "Number of services with a Local traffic policy and no endpoints",
        [(f'{{traffic_policy="{p}"}}', 0.0) for p in ("external", "internal")],
    )
    _gauge(
        lines,
        "kubeproxy_sync_proxy_rules_service_changes_pending",
        "Pending proxy rules Service changes",
        [("", 0.0)],
    )
    _counter(
        lines,
        "kubeproxy_sync_proxy_rules_service_changes_total",
        "Cumulative proxy rules Service changes",
        [("", 22.0)],
    )
    return "\n".join(lines) + "\n"


def metrics_body(state: dict[str, Any], now: float) -> str:
    if state.get("release") == "v1.30.3":
        return metrics_body_v1_30_3(state, now)
    fams = list(state["families"])

    def per_fam(value: float) -> list[tuple[str, float]]:
        return [(f'{{ip_family="{f}"}}', value) for f in fams]

    mode = state["mode"]
    failures = float(state["sync_failures"])
    last = now - float(state["last_sync_age"])
    lines: list[str] = []
    _histogram(
        lines,
        "kubeproxy_network_programming_duration_seconds",
        "In Cluster Network Programming Latency in seconds",
        fams,
    )
    _counter(
        lines,
        "kubeproxy_proxy_healthz_total",
        "Cumulative proxy healthz HTTP status",
        [('{code="200"}', 120.0)] + ([('{code="503"}', 3.0)] if not state["healthy"] else []),
    )
    _counter(
        lines,
        "kubeproxy_proxy_livez_total",
        "Cumulative proxy livez HTTP status",
        [('{code="200"}', 120.0)],
    )
    _histogram(
        lines,
        "kubeproxy_sync_proxy_rules_duration_seconds",
        "SyncProxyRules latency in seconds",
        fams,
    )
    _gauge(
        lines,
        "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
        "Pending proxy rules Endpoint changes",
        per_fam(0.0),
    )
    _counter(
        lines,
        "kubeproxy_sync_proxy_rules_endpoint_changes_total",
        "Cumulative proxy rules Endpoint changes",
        per_fam(57.0),
    )
    _gauge(
        lines,
        "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
        "The last time a sync of proxy rules was queued",
        per_fam(last),
    )
    _gauge(
        lines,
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
        "The last time proxy rules were successfully synced",
        per_fam(last),
    )
    _counter(
        lines,
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
        "Number of services with a Local traffic policy and no endpoints",
        [
            (f'{{ip_family="{f}",traffic_policy="{p}"}}', 0.0)
            for f in fams
            for p in ("external", "internal")
        ],
    )
    _gauge(
        lines,
        "kubeproxy_sync_proxy_rules_service_changes_pending",
        "Pending proxy rules Service changes",
        per_fam(0.0),
    )
    _counter(
        lines,
        "kubeproxy_sync_proxy_rules_service_changes_total",
        "Cumulative proxy rules Service changes",
        per_fam(23.0),
    )
    if mode == "nftables":
        _counter(
            lines,
            "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
            "Cumulative proxy nftables sync failures",
            per_fam(failures),
        )
        _counter(
            lines,
            "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total",
            "Cumulative proxy nftables cleanup failures",
            per_fam(0.0),
        )
    elif mode == "iptables":
        _counter(
            lines,
            "kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
            "packets dropped by iptables to work around conntrack problems",
            [("", 0.0)],
        )
        _counter(
            lines,
            "kubeproxy_iptables_localhost_nodeports_accepted_packets_total",
            "Number of packets accepted on nodeports of loopback interface",
            [("", 0.0)],
        )
        _counter(
            lines,
            "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
            "Cumulative proxy iptables restore failures",
            per_fam(failures),
        )
    elif mode == "ipvs":
        _counter(
            lines,
            "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
            "Cumulative proxy iptables restore failures",
            per_fam(failures),
        )
    return "\n".join(lines) + "\n"


class Handler(BaseHTTPRequestHandler):
    state_file: Path
    role: str  # "metrics" (:10249) or "healthz" (:10256)
    server_version = "fake-kube-proxy"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # keep the test's output quiet

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        state = load_state(self.state_file)
        if state["garbage"]:
            self._send(200, os.urandom(64) + b"\xff\xfe{not json", "application/octet-stream")
            return
        now = time.time()
        path = self.path.split("?", 1)[0]
        text = "text/plain; charset=utf-8"
        if self.role == "metrics" and path == "/proxyMode":
            self._send(200, str(state["mode"]).encode(), text)
        elif self.role == "metrics" and path == "/metrics":
            self._send(200, metrics_body(state, now).encode(), "text/plain; version=0.0.4")
        elif self.role == "metrics" and path == "/healthz":
            self._send(200, b"ok", text)  # the apiserver-style check on the metrics port
        elif self.role == "healthz" and path == "/livez" and state["healthz_format"] == "oldest":
            self._send(404, b"404 page not found\n", text)  # a release before /livez
        elif self.role == "healthz" and path in ("/healthz", "/livez"):
            if state.get("release") == "v1.30.3":
                # v1.30.3: Go time strings (healthz_body leaves nodeEligible out of /livez)
                state = {**state, "healthz_format": "old"}
            code, body = healthz_body(state, now, livez=path == "/livez")
            if path == "/livez" and state["healthz_format"] == "json":
                data = json.loads(body)
                data.pop("nodeEligible", None)
                body = json.dumps(data, separators=(",", ":"))
            self._send(code, body.encode(), "application/json")
        else:
            self._send(404, b"404 page not found\n", text)


class _Server6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def _server(listen: str, handler: type[Handler]) -> ThreadingHTTPServer:
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    cls = _Server6 if ":" in host else ThreadingHTTPServer
    return cls((host, int(port)), handler)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m lab.fake_kube_proxy")
    ap.add_argument("--state-file", required=True, type=Path)
    ap.add_argument("--metrics-listen", default="127.0.0.1:10249")
    ap.add_argument("--healthz-listen", default="127.0.0.1:10256")
    args = ap.parse_args(argv)
    servers = [
        _server(
            listen,
            type(f"{role}Handler", (Handler,), {"state_file": args.state_file, "role": role}),
        )
        for role, listen in (("metrics", args.metrics_listen), ("healthz", args.healthz_listen))
    ]
    for srv in servers:
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    pid_file = Path(f"{args.state_file}.pid")
    pid_file.write_text(f"{os.getpid()}\n")
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for srv in servers:
            srv.shutdown()
            srv.server_close()
        pid_file.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
