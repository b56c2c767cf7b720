"""Fuzzing of the parsers of what the agent reads.

Property, for every parser: on any input - mutations of real recorded inputs (kube-proxy
v1.30.3's answers in tests/data, the iptables-save text of a lab node in a namespace on this
kernel, real kube-proxy's IPVS rules from the VM) and random text or bytes - the parser
returns a value of its documented type or raises its documented error class; never another
exception, never a hang (each call runs under a real timer that interrupts it), and its output
stays bounded by its input.

Hypothesis runs derandomized with no database (tests/fault/conftest.py): the same examples on
every run. A failure prints the smallest input found.
"""

from __future__ import annotations

import json
import signal
import socket
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agent.cleanup import ipvsadm_rules
from agent.readers import iptables_save, ipvs, kube_proxy, kube_proxy_config, netlink
from agent.readers._timing import Absent
from agent.snapshot import IptTable, KubeProxyHealth, KubeProxyMetrics

pytestmark = pytest.mark.fault
FUZZ = settings(settings.get_profile("fault"))
DATA = Path(__file__).resolve().parent.parent / "data" / "kube-proxy-v1.30.3"
MODES = ("ipvs", "iptables", "nftables")
STATES = sorted((DATA / "states").glob("*/state-*.json"))
T = TypeVar("T")

# Per call: far above any parser's time on these inputs (milliseconds), far below a hang.
CALL_SECONDS = 5.0


class Hang(AssertionError):
    pass


@contextmanager
def bounded(seconds: float = CALL_SECONDS) -> Iterator[None]:
    """Interrupt the block after `seconds` of wall-clock time (SIGALRM; the regex engine and
    Python loops both check for signals)."""

    def expired(signum: int, frame: Any) -> None:
        raise Hang(f"no answer within {seconds}s: a hang")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def outcome(call: Callable[[], T], allowed: tuple[type[BaseException], ...]) -> T | None:
    """The value of `call`, or None when it raised one of `allowed`; any other exception
    (and a hang) fails the example."""
    try:
        with bounded():
            try:
                return call()
            except allowed:
                return None
    except Hang as exc:  # raised anew: the interrupted frames' traceback cannot be printed
        raise Hang(str(exc)) from None


# --- mutations of real inputs -----------------------------------------------------------------

# Pieces that matter to the formats parsed here, inserted at random places.
TOKENS = (
    "\n", "\r\n", "\r", "\0", " ", "\t", '"', "'", "\\", "{", "}", "[", "]", ",", ":", "=", "#",
    "-", "--", "-A ", "-I ", ":KUBE-X - [0:0]", "*nat", "*filter", "COMMIT", "-j KUBE-SERVICES",
    '--comment "x y"', "->", "FWM", "TCP", "UDP", "SCTP", "0A600001:01BB", "[fd00::1]:01BB",
    "Masq", "Route", "Tunnel", "persistent", "-f", "-t", "-u", "-s", "-p", "-M", "-r", "-m", "-g",
    "-w", "-6", "-o", "--pe", "-b", "99999999999", "\u00b2", "\u0661", "-5", "+5", "0x1F", "1_0",
    "nan", "inf", "-inf", "1e999", "9999-12-31", "0000-00-00", "T", "Z", "+00:00", "-23:59",
    " m=+12.3", "lastUpdated", "currentTime", "status", "nodeEligible", "healthy", "null", "true",
    "&a", "*a", "!!int", "!!timestamp", "!!binary", "---", "...", "kind: ", "mode: ", "\ufeff",
    "\udc80",
)  # fmt: skip


@st.composite
def mutated(draw: st.DrawFn, seeds: list[str]) -> str:
    """One seed, maybe cut to a window of its lines, then up to 6 edits."""
    text = draw(st.sampled_from(seeds))
    if draw(st.booleans()):
        lines = text.splitlines(keepends=True)
        start = draw(st.integers(0, max(0, len(lines) - 1)))
        text = "".join(lines[start : start + draw(st.integers(1, 40))])
    for _ in range(draw(st.integers(0, 6))):
        n = len(text)
        at = draw(st.integers(0, n))
        end = draw(st.integers(at, min(n, at + 64)))
        ops = ("delete", "duplicate", "insert", "token", "truncate", "swap", "digit", "digit")
        op = draw(st.sampled_from(ops))
        if op == "digit":  # another number where one was: month 13, port 99999, size -4
            text = text[:at] + draw(st.sampled_from("0123456789-")) + text[at + 1 :]
        elif op == "delete":
            text = text[:at] + text[end:]
        elif op == "duplicate":
            text = text[:end] + text[at:end] * draw(st.integers(1, 20)) + text[end:]
        elif op == "insert":
            text = text[:at] + draw(st.text(max_size=16)) + text[at:]
        elif op == "token":
            text = text[:at] + draw(st.sampled_from(TOKENS)) + text[at:]
        elif op == "truncate":
            text = text[:at]
        else:
            lines = text.splitlines(keepends=True)
            if len(lines) > 1:
                i = draw(st.integers(0, len(lines) - 1))
                j = draw(st.integers(0, len(lines) - 1))
                lines[i], lines[j] = lines[j], lines[i]
                text = "".join(lines)
    return text


def texts(seeds: list[str]) -> st.SearchStrategy[str]:
    return st.one_of(mutated(seeds), mutated(seeds), st.text(max_size=400))


def encoded(strategy: st.SearchStrategy[str]) -> st.SearchStrategy[bytes]:
    """Text as UTF-8 (lone surrogates as they would arrive: undecodable bytes), or raw bytes."""
    as_bytes = strategy.map(lambda s: s.encode("utf-8", "surrogateescape"))
    return st.one_of(as_bytes, as_bytes, st.binary(max_size=400))


def _state(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


# --- kube-proxy's HTTP answers ----------------------------------------------------------------


def _recorded(name: str) -> list[str]:
    return [(DATA / mode / name).read_text() for mode in MODES]


METRICS = _recorded("metrics.txt")
HEALTHZ = [
    *_recorded("healthz.json"),  # Go's %q timestamps (releases before 1.33)
    *_recorded("livez.json"),
    # 1.33+: RFC 3339 timestamps, healthy, and a status per family
    '{"lastUpdated":"2024-05-25T03:22:43.5Z","currentTime":"2024-05-25T03:22:44Z",'
    '"nodeEligible":true,"healthy":true,"status":{"IPv4":{"lastUpdated":'
    '"2024-05-25T03:22:40Z","healthy":true},"IPv6":{"lastUpdated":"2024-05-25T03:22:41.123456789+02:00",'
    '"healthy":false}}}',
    '{"lastUpdated": "2024-05-25 03:22:43.5 +0000 UTC m=+12.3","currentTime": '
    '"2024-05-25 03:22:44 +0000 UTC m=+13.1", "nodeEligible": true}',
]
TIMESTAMPS = [
    "2024-05-25T03:22:43.5Z",
    "2024-05-25T03:22:43+02:00",
    "2024-05-25 03:22:43.5 +0000 UTC m=+12.3",
    "2024-05-25 03:22:44 -0700 PDT",
]


def _http(status: str, headers: str, body: str) -> str:
    return f"HTTP/1.1 {status}\r\n{headers}\r\n{body}"


def _chunked(body: str, size: int = 1000) -> str:
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return "".join(f"{len(p.encode()):x}\r\n{p}\r\n" for p in parts) + "0\r\n\r\n"


HTTP = [
    _http("200 OK", "Content-Type: text/plain\r\nContent-Length: 8\r\n", "nftables"),
    _http("200 OK", "Content-Type: application/json\r\n", HEALTHZ[0]),
    _http("503 Service Unavailable", "Content-Length: 20\r\n", HEALTHZ[3]),
    _http("200 OK", "Transfer-Encoding: chunked\r\n", _chunked(METRICS[2][:5000])),
    _http("404 Not Found", "Content-Length: 19\r\n", "404 page not found\n"),
]


def _answer(data: bytes) -> tuple[int, bytes]:
    import time

    ours, theirs = socket.socketpair()
    try:
        theirs.sendall(data)
        theirs.shutdown(socket.SHUT_WR)
        conn = kube_proxy._Conn(ours, time.monotonic() + 5)
        status, headers = kube_proxy._head("http://x/", conn.line(kube_proxy.HEADER_LIMIT), conn)
        body = kube_proxy._body("http://x/", conn, headers, kube_proxy.SMALL_LIMIT)
        return status, b"".join(body)
    finally:
        ours.close()
        theirs.close()


@FUZZ
@given(encoded(texts(HTTP)))
@example(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n")
@example(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nabc\r\n0\r\n\r\n")
def test_http_answer(data: bytes) -> None:
    """An answer on a real socket, read by the client's own head and body readers: (status,
    body) or Absent (not HTTP) or Garbage (HTTP whose framing cannot be read)."""
    got = outcome(lambda: _answer(data), (Absent, kube_proxy.Garbage))
    if got is not None:
        status, body = got
        assert isinstance(status, int) and isinstance(body, bytes)
        assert len(body) <= min(len(data), kube_proxy.SMALL_LIMIT)
        mode = outcome(lambda: kube_proxy.parse_proxy_mode(status, body), (kube_proxy.Garbage,))
        assert mode is None or mode in kube_proxy.MODES


@FUZZ
@given(encoded(texts(METRICS)))
def test_metrics(body: bytes) -> None:
    """/metrics: KubeProxyMetrics or Garbage; the samples' own parser: a list or ValueError."""
    got = outcome(lambda: kube_proxy.parse_metrics(body), (kube_proxy.Garbage,))
    assert got is None or isinstance(got, KubeProxyMetrics)
    if got is not None:
        assert len(got.last_sync) <= body.count(b"\n") + 1
    text = body.decode("utf-8", "replace")
    samples = outcome(lambda: kube_proxy.parse_samples(text), (ValueError,))
    if samples is not None:
        assert len(samples) <= len(text.splitlines())
        for s in samples:
            assert isinstance(s.value, float)
            assert sum(len(k) + len(v) for k, v in s.labels.items()) <= len(text)


def test_a_metrics_line_of_many_labels_left_open_is_refused_at_once() -> None:
    """Found by this tier: the sample regex backtracked exponentially over the spaces between
    labels - a 100-byte line took 89 s (a stuck reader, a scrape thread at 100 % CPU)."""
    line = "m{" + 'a=""    ' * 40 + " x"
    with bounded(1.0), pytest.raises(ValueError):
        kube_proxy.parse_samples(line)
    with bounded(1.0), pytest.raises(kube_proxy.Garbage):
        kube_proxy.parse_metrics(line.encode())


@FUZZ
@given(encoded(texts(HEALTHZ)), st.sampled_from((200, 503, 404, 500)))
@example(b'{"lastUpdated": "2024-05-25T03:22:43Z", "status": [1]}', 200)
@example(b'{"lastUpdated": "2024-13-45T03:22:43Z"}', 200)
@example(b"[" * 100_000, 200)
def test_healthz_and_livez(body: bytes, status: int) -> None:
    """/healthz and /livez: KubeProxyHealth or Garbage (Absent: /livez's 404)."""
    got = outcome(lambda: kube_proxy.parse_healthz(status, body), (kube_proxy.Garbage,))
    assert got is None or isinstance(got, KubeProxyHealth)
    if got is not None:
        assert isinstance(got.last_updated, float)
        assert len(got.families) <= body.count(b"lastUpdated")
    live = outcome(lambda: kube_proxy.parse_livez(status, body), (kube_proxy.Garbage, Absent))
    assert live is None or isinstance(live, KubeProxyHealth)


@FUZZ
@given(texts(TIMESTAMPS))
@example("2024-13-45T00:00:00Z")
@example("9999-12-31T23:59:59-23:59")
@example("0000-01-01 00:00:00 +0000 UTC")
def test_healthz_timestamps(text: str) -> None:
    """Both formats kube-proxy has used: seconds as a float, or Garbage."""
    got = outcome(lambda: kube_proxy.parse_timestamp(text), (kube_proxy.Garbage,))
    assert got is None or isinstance(got, float)


# --- iptables-save ----------------------------------------------------------------------------


def _save_text(tables: dict[str, dict[str, list[str]]], prefix: str) -> str:
    out = []
    for key, chains in tables.items():
        if not key.startswith(prefix):
            continue
        out.append(
            f"# Generated by iptables-nft-save v1.8.9 (nf_tables) on Thu Dec  3 19:49:29 2026\n*{key.rsplit('/', 1)[1]}"
        )
        builtin = {"INPUT", "OUTPUT", "FORWARD", "PREROUTING", "POSTROUTING"}
        out += [f":{c} {'ACCEPT' if c in builtin else '-'} [0:0]" for c in chains]
        out += [f"-A {c} {r}" for c, rules in chains.items() for r in rules]
        out.append("COMMIT\n# Completed on Thu Dec  3 19:49:29 2026")
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def iptables_seeds(netns: Callable[[], str]) -> list[str]:
    """Real iptables-save output: a lab node on this kernel (both backends, both families,
    ipvs- and iptables-mode chains, third-party ones) and real kube-proxy's recorded tables."""
    from lab import build
    from lab.scenarios import realistic_node

    seeds = []
    for backend in ("nft", "legacy"):
        ns = netns()
        build.build(
            ns,
            realistic_node(
                dual_stack=True,
                backend=backend,
                third_party=True,
                old_release_orphans=True,
                iptables_mode=True,
            ),
        )
        for tool in (f"iptables-{backend}-save", f"ip6tables-{backend}-save"):
            seeds.append(build.run(build.in_ns(ns, tool)))
    for path in STATES:
        tables = _state(path)["iptables"]
        seeds.append(_save_text(tables, next(iter(tables)).rsplit("/", 1)[0]))
    assert all(seed.count("COMMIT") >= 2 for seed in seeds[:4])
    return seeds


@pytest.fixture(scope="module")
def netns() -> Iterator[Callable[[], str]]:
    """Namespaces for the whole module (the seeds are read once)."""
    import uuid

    from lab import build

    made: list[str] = []

    def make() -> str:
        name = f"ilt-fz-{uuid.uuid4().hex[:8]}"
        build.create_netns(name)
        made.append(name)
        return name

    yield make
    for name in made:
        build.delete_netns(name)


def test_iptables_save(iptables_seeds: list[str]) -> None:
    @FUZZ
    @given(texts(iptables_seeds))
    @example("*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -j DROP\n:FORWARD ACCEPT [0:0]\nCOMMIT\n")
    def check(text: str) -> None:
        got = outcome(
            lambda: iptables_save.parse(text, "nft", "ipv4"), (iptables_save.IptablesSaveError,)
        )
        if got is None:
            return
        assert isinstance(got, tuple) and all(isinstance(t, IptTable) for t in got)
        rules = [r for t in got for c in t.chains for r in c.rules]
        assert len(got) <= text.count("\n") + 1
        assert len(rules) <= len(text.splitlines())
        assert sum(len(r.text) for r in rules) <= len(text)

    check()
    # the unmutated seeds parse whole
    for seed in iptables_seeds:
        assert sum(len(t.chains) for t in iptables_save.parse(seed, "nft", "ipv4")) > 0


# --- /proc/net/ip_vs --------------------------------------------------------------------------


def _proc_host(host: str) -> str:
    if ":" in host:
        return "[" + ":".join(socket.inet_pton(socket.AF_INET6, host).hex(":", 2).split(":")) + "]"
    return socket.inet_aton(host).hex().upper()


def _proc_endpoint(text: str) -> str:
    host, _, port = text.rpartition(":")
    return f"{_proc_host(host.strip('[]'))}:{int(port):04X}"


def _proc_text(state: dict[str, Any]) -> str:
    """/proc/net/ip_vs as ip_vs_info_seq_show prints the state real kube-proxy made."""
    protocols = {"-t": "TCP", "-u": "UDP", "--sctp-service": "SCTP"}
    lines = [
        "IP Virtual Server version 1.2.1 (size=4096)",
        "Prot LocalAddress:Port Scheduler Flags",
        "  -> RemoteAddress:Port Forward Weight ActiveConn InActConn",
    ]
    for key, line in state["ipvs_lines"].items():
        words = line.split()
        flags = f" persistent {words[words.index('-p') + 1]} FFFFFFFF" if "-p" in words else ""
        lines.append(f"{protocols[words[1]]}  {_proc_endpoint(words[2])} {words[4]}{flags}")
        for dest in state["ipvs"].get(key, []):
            d = dest.split()
            lines.append(
                f"  -> {_proc_endpoint(d[d.index('-r') + 1])}      Masq    1      0          0"
            )
    return "\n".join(lines) + "\n"


PROC = [_proc_text(_state(p)) for p in STATES if _state(p)["ipvs_lines"]] + [
    "IP Virtual Server version 1.2.1 (size=4096)\n"
    "Prot LocalAddress:Port Scheduler Flags\n"
    "  -> RemoteAddress:Port Forward Weight ActiveConn InActConn\n"
    "TCP  0A600001:01BB rr\n"
    "  -> 0AF40003:192B      Masq    1      0          0\n"
    "UDP  0A60000A:0035 rr persistent 10800 FFFFFFFF\n"
    "  -> 0AF40004:0035      Masq    1      0          0\n"
    "TCP  [fd00:0096:0000:0000:0000:0000:0000:0001]:01BB rr\n"
    "  -> [fd00:0010:0000:0000:0000:0000:0000:0004]:01BB      Masq    1      0          0\n"
    "FWM  00000064 rr\n"
    "  -> 0AF40009:0000      Route   1      0          0\n"
    "TCP  C0A8010A:7580 wlc persistent 300 FFFFFF00\n"
    "  -> 0AF40006:1F90      Tunnel  1      0          0\n"
    "UDP  0A600016:13CD rr ops\n"
    "  -> 0AF40007:13CD      Local   0      0          0\n"
]


@FUZZ
@given(texts(PROC))
def test_proc_net_ip_vs(text: str) -> None:
    """The three readings of /proc/net/ip_vs: their value, or ValueError/OSError (what their
    callers catch: read_proc_dests, read_proc_dest_counts, _read_summary)."""
    lines = text.splitlines(keepends=True)
    allowed = (ValueError, OSError)
    counts = outcome(lambda: ipvs.proc_dest_counts(iter(lines)), allowed)
    if counts is not None:
        assert len(counts) <= len(lines) and all(isinstance(v, int) for v in counts.values())
        assert sum(counts.values()) <= len(lines)
    dests = outcome(lambda: ipvs.proc_dests(iter(lines)), allowed)
    if dests is not None:
        assert sum(len(v) for v in dests.values()) <= len(lines)
    services = outcome(lambda: ipvs.proc_services(iter(lines)), allowed)
    if services is not None:
        svcs, per = services
        assert len(svcs) == len(per) <= len(lines)


def test_the_proc_seeds_read_as_the_recorded_state() -> None:
    for path in STATES:
        state = _state(path)
        if not state["ipvs_lines"]:
            continue
        counts = ipvs.proc_dest_counts(iter(_proc_text(state).splitlines(keepends=True)))
        assert sum(counts.values()) == sum(len(v) for v in state["ipvs"].values())


# --- kube-proxy's configuration ---------------------------------------------------------------

CONFIGS = [
    # kubeadm's KubeProxyConfiguration, as its ConfigMap holds it
    "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nbindAddress: 0.0.0.0\n"
    'bindAddressHardFail: false\nclientConnection:\n  acceptContentTypes: ""\n  burst: 0\n'
    '  contentType: ""\n  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf\n  qps: 0\n'
    "clusterCIDR: 10.244.0.0/16\nconfigSyncPeriod: 0s\nconntrack:\n  maxPerCore: null\n"
    "  min: null\n  tcpCloseWaitTimeout: null\n  tcpEstablishedTimeout: null\n"
    'detectLocalMode: ""\nenableProfiling: false\nhealthzBindAddress: ""\n'
    'hostnameOverride: ""\niptables:\n  localhostNodePorts: null\n  masqueradeAll: false\n'
    "  masqueradeBit: null\n  minSyncPeriod: 0s\n  syncPeriod: 0s\nipvs:\n"
    '  excludeCIDRs: null\n  minSyncPeriod: 0s\n  scheduler: ""\n  strictARP: true\n'
    "  syncPeriod: 0s\n  tcpFinTimeout: 0s\n  tcpTimeout: 0s\n  udpTimeout: 0s\n"
    'kind: KubeProxyConfiguration\nmetricsBindAddress: ""\nmode: nftables\n'
    "nodePortAddresses:\n- 192.168.50.0/24\n- primary\noomScoreAdj: null\n",
    '{"kind":"KubeProxyConfiguration","mode":"ipvs","ipvs":{"scheduler":"rr","strictARP":"true"},'
    '"nodePortAddresses":["10.0.0.0/8"],"iptables":{"localhostNodePorts":false}}',
    "---\nkind: Pod\n---\nkind: KubeProxyConfiguration\nmode: ipvs\nipvs: {scheduler: wlc}\n",
]


@FUZZ
@given(texts(CONFIGS))
@example("kind: KubeProxyConfiguration\nmode: ipvs\nsince: 2024-13-45\n")
@example("kind: KubeProxyConfiguration\nmode: !!int x\n")
@example("[" * 1200)  # past the recursion limit: RecursionError inside PyYAML
@example("{" + '"a":[' * 100_000)
def test_kube_proxy_config(text: str) -> None:
    """The file: a dict of settings or ConfigError."""

    def parse() -> dict[str, Any]:
        return kube_proxy_config.settings(kube_proxy_config.parse_config_text(text), "F")

    got = outcome(parse, (kube_proxy_config.ConfigError,))
    if got is not None:
        assert set(got) <= {
            "mode", "node_port_addresses", "bind_address", "ipvs_scheduler", "ipvs_strict_arp",
            "localhost_node_ports", "_origins",
        }  # fmt: skip
        for key in ("mode", "bind_address", "ipvs_scheduler"):
            assert key not in got or len(got[key]) <= len(text)


@FUZZ
@given(st.lists(st.one_of(st.sampled_from(CONFIG_FLAGS := [
    "kube-proxy", "--proxy-mode", "--proxy-mode=ipvs", "--config", "--config=/x.yaml",
    "--ipvs-strict-arp", "--ipvs-strict-arp=false", "--ipvs-strict-arp=maybe", "--nodeport-addresses",
    "1.2.3.0/24,,primary", "--bind-address", "-", "--", "-v=2", "=", "--=x",
]), st.text(max_size=20)), max_size=12))  # fmt: skip
def test_kube_proxy_flags(argv: list[str]) -> None:
    """The command line: the flags, and their settings or ConfigError (a bad boolean)."""
    flags = outcome(lambda: kube_proxy_config.parse_flags(argv), ())
    assert flags is not None and len(flags) <= len(argv)
    assert all(isinstance(v, str) for v in flags.values())
    got = outcome(
        lambda: kube_proxy_config._from_flags(flags, "pid 1"), (kube_proxy_config.ConfigError,)
    )
    assert got is None or set(got) <= {*kube_proxy_config._FLAGS.values(), "_origins"}


def test_a_config_file_that_multiplies_by_aliases_is_read_in_bounded_time(tmp_path: Path) -> None:
    """YAML aliases nest a 10-element list 9 levels deep: a billion strings if printed. The
    settings are strings, so such a value is refused, not turned into text."""
    lines = [
        "kind: KubeProxyConfiguration",
        'a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
    ]
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]")
    for key in ("mode", "bindAddress"):
        path = tmp_path / f"{key}.yaml"
        path.write_text("\n".join([*lines, f"{key}: *a9"]) + "\n")
        with bounded(5.0):
            r = kube_proxy_config.read_file(str(path))
        assert r.status == "error" and r.error is not None and key in r.error, r
    path = tmp_path / "ipvs.yaml"
    path.write_text("\n".join([*lines, "ipvs: {scheduler: *a9}"]) + "\n")
    with bounded(5.0):
        r = kube_proxy_config.read_file(str(path))
    assert r.status == "error" and r.error is not None and "ipvs.scheduler" in r.error, r


@FUZZ
@given(encoded(texts(CONFIGS)))
def test_kube_proxy_config_file(tmp_path_factory: pytest.TempPathFactory, raw: bytes) -> None:
    """--kube-proxy-config FILE: a Reading, never an exception (the module's promise)."""
    path = tmp_path_factory.getbasetemp() / "kube-proxy.yaml"
    path.write_bytes(raw)
    got = outcome(lambda: kube_proxy_config.read_file(str(path)), ())
    assert got is not None and got.status in ("ok", "error")


# --- `ipvsadm -S -n` (restore's IPVS lines) ----------------------------------------------------

IPVSADM = [
    "".join(
        f"{line}\n" + "".join(f"{d}\n" for d in _state(p)["ipvs"].get(key, []))
        for key, line in _state(p)["ipvs_lines"].items()
    )
    for p in STATES
    if _state(p)["ipvs_lines"]
] + [
    "-A -t 10.96.0.1:443 -s rr -p 10800\n-a -t 10.96.0.1:443 -r 192.168.4.11:6443 -m -w 1\n"
    "-A -u [fd00::a]:53 -s wlc -M 64 -b sh-fallback,sh-port -o\n"
    "-a -u [fd00::a]:53 -r [fd00:10::4]:53 -g -w 0\n"
    "-A -f 16384 -6 -s sh --pe sip\n-A --sctp-service 10.96.1.10:9000 -s rr -M 255.255.255.0\n"
]


@FUZZ
@given(texts(IPVSADM))
@example("-A -f --5 -s rr")
@example("-A -t 1.2.3.4:\u00b2 -s rr")
@example("-A -t 1.2.3.4:80 -s rr -p 99999999999")
@example("-A -t 1.2.3.4\x00:80 -s rr")
@example("-A -t 1.2.3.4:80 -s rr -M 1.2.3.4\x00")
@example("-A -t 1.2.3.4:80 -s " + "r" * 70_000)
@example("-a -t 1.2.3.4:80 -r 10.0.0.1:80 -m -w \u0661")
def test_ipvsadm_rules(text: str) -> None:
    """Requests, or None for a line it does not know (restore then hands the text to
    `ipvsadm -R`); never an exception."""
    got = outcome(lambda: ipvsadm_rules.parse(text), ())
    if got is not None:
        assert len(got.services) == len(got.service_lines)
        assert len(got.dests) == len(got.dest_lines)
        assert len(got.services) + len(got.dests) <= len(text.splitlines())
        assert all(len(b) <= 200 for b in (*got.services, *got.dests))


def test_the_recorded_ipvsadm_lines_are_understood() -> None:
    for seed in IPVSADM:
        assert ipvsadm_rules.parse(seed) is not None, seed


# --- netlink attributes -----------------------------------------------------------------------


def _answers() -> list[bytes]:
    """IPVS answers and link dumps as the kernel lays them out."""
    a = netlink.attr
    svc = b"".join(
        [
            a(1, struct.pack("=H", socket.AF_INET6)),
            a(2, struct.pack("=H", 6)),
            a(3, socket.inet_pton(socket.AF_INET6, "fd00::1")),
            a(4, struct.pack("!H", 443)),
            a(6, b"wlc\0"),
            a(7, struct.pack("=II", 3, 0xFFFFFFFF)),
            a(8, struct.pack("=I", 10800)),
            a(9, struct.pack("=I", 128)),
            a(10 | netlink.NLA_F_NESTED, a(1, struct.pack("=I", 5))),
        ]
    )
    link = struct.pack("=BxHiII", 0, 1, 7, 1, 0) + a(3, b"kube-ipvs0\0")
    link += a(18 | netlink.NLA_F_NESTED, a(1, b"dummy\0"))
    return [struct.pack("=BBH", 1, 1, 0) + a(1 | netlink.NLA_F_NESTED, svc), link, svc]


ANSWERS = _answers()


@st.composite
def wire(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(ANSWERS)))
    for _ in range(draw(st.integers(0, 8))):
        at = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(("byte", "cut", "insert", "length")))
        if op == "byte" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif op == "cut":
            del data[at : at + draw(st.integers(1, 8))]
        elif op == "insert":
            data[at:at] = draw(st.binary(max_size=8))
        elif op == "length" and at + 2 <= len(data):
            data[at : at + 2] = struct.pack("=H", draw(st.sampled_from((0, 1, 3, 4, 5, 0xFFFF))))
    return bytes(data)


@FUZZ
@given(st.one_of(wire(), wire(), st.binary(max_size=400)), st.integers(0, 24))
@example(netlink.attr(3, b"x\xff\0"), 0)
def test_netlink_attributes(data: bytes, offset: int) -> None:
    """attrs/count_attrs: a dict of views inside the data, for any bytes; nul_text: a str."""
    got = outcome(lambda: netlink.attrs(data, offset), ())
    assert got is not None and len(got) <= max(0, len(data) - offset) // 4
    assert all(len(v) <= len(data) for v in got.values())
    n = outcome(lambda: netlink.count_attrs(memoryview(data)), ())
    assert n is not None and n <= len(data) // 4
    for view in got.values():
        nested = outcome(lambda v=view: netlink.attrs(v), ())  # type: ignore[misc]
        assert nested is not None
        text = outcome(lambda v=view: netlink.nul_text(v), ())  # type: ignore[misc]
        assert isinstance(text, str) and len(text) <= 4 * len(view)


def test_seed_counts() -> None:
    """The seeds are there: a missing data file would fuzz random text only."""
    assert (len(METRICS), len(HEALTHZ), len(STATES)) == (3, 8, 16)
    assert len(PROC) >= 5 and len(IPVSADM) >= 5


def test_lab_iptables_seeds_hold_both_modes(iptables_seeds: list[str]) -> None:
    joined = "".join(iptables_seeds)
    for name in ("KUBE-LOAD-BALANCER", "KUBE-SVC-", "KUBE-MARK-MASQ", "DOCKER", "CNI-"):
        assert name in joined, name


def test_a_link_named_in_bytes_that_are_not_utf8_is_read(netns: Callable[[], str]) -> None:
    """Found by this tier: a link name is any bytes but '/', ':' and spaces; one foreign link
    named so made the link reading fail (UnicodeDecodeError) and with it every cleanup plan."""
    from lab import build
    from tests.conftest import run_agent

    ns = netns()
    build.run(["ip", "-n", ns, "link", "add", "name", "x\udcff", "type", "veth", "peer", "p0"])
    r = run_agent(ns, "audit", "--json")
    assert r.json["sources"]["links"]["status"] == "ok", r.json["sources"]["links"]
