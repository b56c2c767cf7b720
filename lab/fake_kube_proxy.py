"""A stand-in for kube-proxy's metrics (:10249) and healthz (:10256) servers (docs/kube-proxy-names.md#kube-proxys-endpoints-and-metrics).

Run inside a namespace: python -m lab.fake_kube_proxy --state-file PATH. The JSON state file is
re-read on every request, so a test flips behaviour by rewriting it:
  {"mode": "nftables"|"ipvs"|"iptables", "families": ["IPv4", "IPv6"], "healthy": true,
   "last_sync_age": 5.0, "healthz_format": null|"json"|"old"|"oldest", "garbage": false,
   "sync_failures": 0, "queued_age": null, "node_eligible": true,
   "release": null|"v1.30.3"|"v1.34.4"|"v1.35.4"|"v1.36.3"|"v1.37.2"}
"release" picks the profile of a real release (PROFILES), each checked against what that
release served (tests/data/kube-proxy-<release>, tests/unit/test_recorded_releases.py); null is
the newest, v1.37.2. Since 1.33: /healthz and /livez in JSON with RFC 3339 times, `healthy` and a
per-family `status`, and ip_family labels; counters that have not moved are absent, so
"sync_failures" 0 serves no kubeproxy_sync_proxy_rules_nftables_sync_failures_total (nftables
mode) and no ..._iptables_restore_failures_total (ipvs, iptables mode). v1.30.3: Go time
strings, no ip_family label, every series at 0 from the start (docs/kube-proxy-releases.md).
"healthz_format" null is the release's; a value overrides it for the health bodies only:
"old" is 1.30-1.32's Go-time strings, "oldest" a release before /livez (404 there).
"queued_age" null serves the last queued time equal to the last sync ("last_sync_age"); a
number serves a change queued that many seconds ago (smaller than "last_sync_age": queued after
the last successful sync, a change no sync has followed). "sync_failures" is served for each family.
node_eligible false is a node being deleted: /healthz answers 503 (its `healthy` stays the
proxier's own), /livez ignores it (as kube-proxy's proxy_health.go).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

DEFAULT_STATE: dict[str, Any] = {
    "mode": "nftables",
    "families": ["IPv4"],
    "healthy": True,
    "last_sync_age": 5.0,
    "healthz_format": None,
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
    """Go's time.RFC3339Nano, as encoding/json writes a time.Time: nanoseconds with the
    trailing zeros of the fraction dropped, "Z" for UTC."""
    ns = round(ts * 1e9)
    dt = datetime.fromtimestamp(ns // 10**9, UTC)
    frac = f"{ns % 10**9:09d}".rstrip("0")
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


def health_format(state: dict[str, Any]) -> str:
    """The state's healthz_format, else its release's."""
    return str(state.get("healthz_format") or profile(state).health)


def healthz_body(state: dict[str, Any], now: float, livez: bool = False) -> tuple[int, str]:
    eligible = bool(state.get("node_eligible", True))
    proxier_healthy = bool(state["healthy"])
    # /healthz also needs an eligible node; /livez only the proxiers (proxy_health.go)
    code = 200 if proxier_healthy and (eligible or livez) else 503
    last = now - float(state["last_sync_age"])
    # On 200 kube-proxy reports lastUpdated as "now" for backward compatibility.
    shown = now if code == 200 else last
    fmt = health_format(state)
    if livez and fmt == "old":
        fmt = "oldest"  # 1.30's /livez: the /healthz document without nodeEligible
    if fmt == "old":
        return code, (
            f'{{"lastUpdated": "{go_time_string(shown)}","currentTime": '
            f'"{go_time_string(now)}", "nodeEligible": {str(eligible).lower()}}}'
        )
    if fmt == "oldest":
        return code, (
            f'{{"lastUpdated": "{go_time_string(shown)}","currentTime": "{go_time_string(now)}"}}'
        )
    body: dict[str, Any] = {"lastUpdated": rfc3339nano(shown), "currentTime": rfc3339nano(now)}
    if not livez:
        body["nodeEligible"] = eligible
    body["healthy"] = proxier_healthy
    body["status"] = {  # encoding/json writes a map's keys sorted
        fam: {"lastUpdated": rfc3339nano(last), "healthy": proxier_healthy}
        for fam in sorted(state["families"])
    }
    return code, json.dumps(body, separators=(",", ":"))


# --- /metrics: one table of kubeproxy_* families per release ---------------------------------
#
# Each family as kube-proxy's pkg/proxy/metrics registers it: its type, HELP, the label names
# besides ip_family, the proxy modes that register it, and whether it is a *Vec that is absent
# until it first moves (a counter nobody incremented, a histogram nobody observed). Checked
# against every recorded release by tests/unit/test_recorded_releases.py.

ALL_MODES = frozenset({"ipvs", "iptables", "nftables"})
IPVS, IPTABLES, NFTABLES = frozenset({"ipvs"}), frozenset({"iptables"}), frozenset({"nftables"})


@dataclass(frozen=True)
class Family:
    type: str  # counter | gauge | histogram
    help: str
    modes: frozenset[str] = ALL_MODES
    labels: tuple[str, ...] = ()  # label names other than ip_family
    per_family: bool = True  # one series per IP family (an ip_family label, >= 1.33)
    moved_only: bool = False  # absent until it first moves (a *Vec never touched)


@dataclass(frozen=True)
class Profile:
    """What one kube-proxy release serves: the /healthz format and its kubeproxy_* families."""

    health: str  # "json" (RFC 3339 times, healthy, per-family status) or "old" (Go times)
    families: dict[str, Family]


def _f(help_: str, type_: str = "counter", **kw: Any) -> Family:
    return Family(type_, f"[ALPHA] {help_}", **kw)


# v1.34.4 as recorded (tests/data/kube-proxy-v1.34.4; v1.37.2 the same), the releases since 1.33.
_V1_34: dict[str, Family] = {
    "kubeproxy_conntrack_reconciler_deleted_entries_total": _f(
        "Cumulative conntrack flows deleted by conntrack reconciler"
    ),
    "kubeproxy_conntrack_reconciler_sync_duration_seconds": _f(
        "ReconcileConntrackFlowsLatency latency in seconds", "histogram"
    ),
    "kubeproxy_iptables_ct_state_invalid_dropped_packets_total": _f(
        "packets dropped by iptables to work around conntrack problems",
        modes=IPTABLES,
        per_family=False,
    ),
    "kubeproxy_iptables_localhost_nodeports_accepted_packets_total": _f(
        "Number of packets accepted on nodeports of loopback interface",
        modes=IPTABLES,
        per_family=False,
    ),
    "kubeproxy_network_programming_duration_seconds": _f(
        "In Cluster Network Programming Latency in seconds", "histogram", moved_only=True
    ),
    "kubeproxy_proxy_healthz_total": _f(
        "Cumulative proxy healthz HTTP status", labels=("code",), per_family=False
    ),
    "kubeproxy_proxy_livez_total": _f(
        "Cumulative proxy livez HTTP status", labels=("code",), per_family=False
    ),
    "kubeproxy_sync_full_proxy_rules_duration_seconds": _f(
        "SyncProxyRules latency in seconds for full resyncs",
        "histogram",
        modes=IPTABLES | NFTABLES,
    ),
    "kubeproxy_sync_partial_proxy_rules_duration_seconds": _f(
        "SyncProxyRules latency in seconds for partial resyncs",
        "histogram",
        modes=IPTABLES | NFTABLES,
        moved_only=True,
    ),
    "kubeproxy_sync_proxy_rules_duration_seconds": _f(
        "SyncProxyRules latency in seconds", "histogram"
    ),
    "kubeproxy_sync_proxy_rules_endpoint_changes_pending": _f(
        "Pending proxy rules Endpoint changes", "gauge", per_family=False
    ),
    "kubeproxy_sync_proxy_rules_endpoint_changes_total": _f(
        "Cumulative proxy rules Endpoint changes", per_family=False
    ),
    "kubeproxy_sync_proxy_rules_iptables_last": _f(
        "Number of iptables rules written by kube-proxy in last sync",
        "gauge",
        modes=IPTABLES,
        labels=("table",),
    ),
    "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total": _f(
        "Cumulative proxy iptables partial restore failures", modes=IPTABLES, moved_only=True
    ),
    "kubeproxy_sync_proxy_rules_iptables_restore_failures_total": _f(
        "Cumulative proxy iptables restore failures", modes=IPVS | IPTABLES, moved_only=True
    ),
    "kubeproxy_sync_proxy_rules_iptables_total": _f(
        "Total number of iptables rules owned by kube-proxy",
        "gauge",
        modes=IPTABLES,
        labels=("table",),
    ),
    "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds": _f(
        "The last time a sync of proxy rules was queued", "gauge"
    ),
    "kubeproxy_sync_proxy_rules_last_timestamp_seconds": _f(
        "The last time proxy rules were successfully synced", "gauge"
    ),
    "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total": _f(
        "Cumulative proxy nftables cleanup failures", modes=NFTABLES, moved_only=True
    ),
    "kubeproxy_sync_proxy_rules_nftables_sync_failures_total": _f(
        "Cumulative proxy nftables sync failures", modes=NFTABLES, moved_only=True
    ),
    "kubeproxy_sync_proxy_rules_no_local_endpoints_total": _f(
        "Number of services with a Local traffic policy and no endpoints",
        "gauge",
        labels=("traffic_policy",),
    ),
    "kubeproxy_sync_proxy_rules_service_changes_pending": _f(
        "Pending proxy rules Service changes", "gauge", per_family=False
    ),
    "kubeproxy_sync_proxy_rules_service_changes_total": _f(
        "Cumulative proxy rules Service changes", per_family=False
    ),
}

_UNLABELLED: dict[str, Any] = {"per_family": False, "moved_only": False}
# v1.30.3 as recorded: no ip_family label, plain metrics (served at 0 from the start), no
# conntrack reconciler series, no kubeproxy_iptables_* series.
_V1_30: dict[str, Family] = {
    **{
        name: replace(fam, **_UNLABELLED)
        for name, fam in _V1_34.items()
        if not name.startswith(("kubeproxy_conntrack_", "kubeproxy_iptables_"))
        and "nftables" not in name
    },
    **{
        name: replace(_V1_34[name], modes=ALL_MODES, **_UNLABELLED)
        for name in (
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
            "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
        )
    },
}

_SINCE_1_33 = Profile("json", _V1_34)
# Each release and what it serves. Releases that serve the same shapes share one profile;
# what changed between them (docs/kube-proxy-releases.md):
#   v1.35.4, v1.36.3: nothing in pkg/proxy/metrics or pkg/proxy/healthcheck/proxy_health.go.
#   v1.37.2: kubeproxy_nftables_localhost_nodeport_* only with the alpha feature gate
#            KubeProxyNFTablesLocalhostNodePorts (off by default, not served here).
PROFILES: dict[str, Profile] = {
    "v1.30.3": Profile("old", _V1_30),
    "v1.34.4": _SINCE_1_33,
    "v1.35.4": _SINCE_1_33,
    "v1.36.3": _SINCE_1_33,
    "v1.37.2": _SINCE_1_33,
}
NEWEST = "v1.37.2"


def profile(state: dict[str, Any]) -> Profile:
    """The release the state names; null is the newest."""
    release = state.get("release") or NEWEST
    try:
        return PROFILES[release]
    except KeyError:
        raise ValueError(f"no profile for kube-proxy release {release!r}") from None


_BUCKETS = ["0.001", "0.002", "0.004", "0.008", "0.016", "0.032", "0.064", "0.128", "0.256"]
_BUCKETS += ["0.512", "1.024", "2.048", "4.096", "8.192", "16.384", "+Inf"]
_LABEL_VALUES = {"table": ("filter", "nat"), "traffic_policy": ("external", "internal")}


def _value(name: str, state: dict[str, Any], now: float, labels: dict[str, str]) -> float:
    mode = state["mode"]
    failures = float(state["sync_failures"])
    if name.endswith("_last_queued_timestamp_seconds") and state.get("queued_age") is not None:
        return now - float(state["queued_age"])
    if name.endswith(("_last_timestamp_seconds", "_last_queued_timestamp_seconds")):
        return now - float(state["last_sync_age"])
    if name == "kubeproxy_sync_proxy_rules_nftables_sync_failures_total":
        return failures
    if name == "kubeproxy_sync_proxy_rules_iptables_restore_failures_total":
        return failures if mode != "nftables" else 0.0
    if name.endswith(("_healthz_total", "_livez_total")):
        return 2.0 if labels["code"] == "200" else 1.0
    if name.endswith("_changes_total"):
        return 14.0 if "endpoint" in name else 26.0
    if name.startswith("kubeproxy_sync_proxy_rules_iptables_") and "table" in labels:
        return 5.0 if labels["table"] == "filter" else 122.0
    return 0.0


def _codes(name: str, state: dict[str, Any]) -> list[dict[str, str]]:
    """200 always (kubelet's probes), 503 once kube-proxy answered one."""
    bad = not state["healthy"] or (
        name == "kubeproxy_proxy_healthz_total" and not state.get("node_eligible", True)
    )
    return [{"code": "200"}] + ([{"code": "503"}] if bad else [])


def _label_sets(name: str, fam: Family, state: dict[str, Any]) -> list[dict[str, str]]:
    sets: list[dict[str, str]] = [{}]
    if fam.per_family:
        sets = [{"ip_family": f} for f in sorted(state["families"])]
    for label in fam.labels:
        if label == "code":
            sets = [{**s, **c} for s in sets for c in _codes(name, state)]
        else:
            sets = [{**s, label: v} for s in sets for v in _LABEL_VALUES[label]]
    return sets


def _text(labels: dict[str, str], extra: str = "") -> str:
    inner = ",".join([f'{k}="{v}"' for k, v in sorted(labels.items())] + ([extra] if extra else []))
    return f"{{{inner}}}" if inner else ""


def metrics_body(state: dict[str, Any], now: float) -> str:
    """The kubeproxy_* families the state's release serves in the state's mode."""
    lines: list[str] = []
    for name, fam in sorted(profile(state).families.items()):
        if state["mode"] not in fam.modes or (fam.moved_only and fam.type == "histogram"):
            continue
        samples = []
        for labels in _label_sets(name, fam, state):
            if fam.type == "histogram":
                count = 2
                for b in _BUCKETS:
                    le = f'le="{b}"'
                    samples.append(f"{name}_bucket{_text(labels, le)} {count * (float(b) > 0.5)}")
                samples += [
                    f"{name}_sum{_text(labels)} 1.5",
                    f"{name}_count{_text(labels)} {count}",
                ]
                continue
            value = _value(name, state, now, labels)
            if fam.moved_only and not value:
                continue
            shown = f"{value:.0f}" if value.is_integer() and abs(value) < 1e15 else repr(value)
            samples.append(f"{name}{_text(labels)} {shown}")
        if samples:
            lines += [f"# HELP {name} {fam.help}", f"# TYPE {name} {fam.type}", *samples]
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
        elif self.role == "healthz" and path == "/livez" and health_format(state) == "oldest":
            self._send(404, b"404 page not found\n", text)  # a release before /livez
        elif self.role == "healthz" and path in ("/healthz", "/livez"):
            code, body = healthz_body(state, now, livez=path == "/livez")
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
