"""One node for the real-kube-proxy tier: a namespace, its veth, listeners, real kube-proxy.

Only for the VM (scripts/vm-run): the veth's peer lives in the VM's root namespace, where the
test process forwards the peer address's API port to the node's real kube-apiserver on the
host (tests/realkp/cluster.py). Nothing here runs on the host.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from tests.realkp.shapes import Shape, config_document, kubeadm_command

REPO = Path(__file__).resolve().parents[2]
LISTEN_PORT = 8080  # the local endpoints' listener, on every address of the namespace
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
T = TypeVar("T")

# `ipvsadm -S -n` as a dump the kernel did not skip: the service dump resumes each part by
# position in one table of every namespace's services (ip_vs_genl_dump_services) and never sets
# NLM_F_DUMP_INTR, so while other nodes' kube-proxies add or remove services, this namespace's
# dump may miss one or list one twice without a word. /proc/net/ip_vs resumes its pages the
# same way, but they end at other services than the dump's parts: read again until the dump
# has as many services as /proc lists, none twice (bounded; the last read is kept, and a real
# change between the two reads only costs a retry). The agent's own check is stronger
# (agent/readers/ipvs.py: two dumps and the kernel's IPv4 count).
IPVSADM_SAVE = (
    "for try in 1 2 3 4 5 6 7 8; do"
    " s=$(ipvsadm -S -n 2>/dev/null);"
    " a=$(printf '%s\\n' \"$s\" | grep -c '^-A');"
    " u=$(printf '%s\\n' \"$s\" | grep '^-A' | sort -u | grep -c .);"
    " p=$(grep -cE '^(TCP|UDP|SCTP|FWM) ' /proc/net/ip_vs 2>/dev/null);"
    ' [ "$a" = "$u" ] && [ "$a" = "${p:-0}" ] && break;'
    " done; printf '%s\\n' \"$s\""
)


def sh(args: list[str], stdin: str | None = None, check: bool = True) -> str:
    p = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} -> {p.returncode}: {p.stderr.strip()[:2000]}")
    return p.stdout


def made_once(d: Path, populate: Callable[[Path], None]) -> Path:
    """Folder `d`, filled by `populate` exactly once however many threads or processes ask at
    the same moment: each maker fills a private temporary folder and renames it into place, and
    a maker that finds `d` already there (its rename refused) discards its own. A reader never
    sees `d` half-filled, and a second maker cannot fail (a fresh clone's run: two nodes' threads met in a
    check-then-create and one died of FileExistsError)."""
    if d.is_dir():
        return d
    d.parent.mkdir(parents=True, exist_ok=True)
    tmp = d.with_name(f".{d.name}-{os.getpid()}-{threading.get_ident()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        populate(tmp)
        tmp.rename(d)  # atomic; refused (ENOTEMPTY/EEXIST) when another maker was first
    except OSError:
        if not d.is_dir():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return d


def tool_dir(backend: str, workdir: Path) -> Path:
    """A folder whose `iptables*` are the chosen backend: first on kube-proxy's PATH."""

    def populate(tmp: Path) -> None:
        for fam in ("iptables", "ip6tables"):
            for suffix in ("", "-save", "-restore"):
                (tmp / f"{fam}{suffix}").symlink_to(f"/usr/sbin/{fam}-{backend}{suffix}")

    return made_once(workdir / f"bin-{backend}", populate)


def path_without(backend: str, workdir: Path, drop: tuple[str, ...] = ("modprobe",)) -> str:
    """kube-proxy's PATH on a node whose image lacks the programs `drop` (`modprobe`, or
    `ipset`): every program of /usr/sbin and /usr/bin but those (kube-proxy finds its tools
    by name on PATH)."""

    def populate(tmp: Path) -> None:
        for src in (Path("/usr/sbin"), Path("/usr/bin")):
            for prog in src.iterdir():
                if prog.name not in drop and not (tmp / prog.name).is_symlink():
                    (tmp / prog.name).symlink_to(prog)

    d = made_once(workdir / f"bin-no-{'-'.join(sorted(drop))}", populate)
    return f"{tool_dir(backend, workdir)}:{d}"


DROPS = (("modprobe",), ("ipset",), ("ipset", "modprobe"))


def make_shared_tools(workdir: Path) -> None:
    """Every folder the nodes share, made before their threads start (made_once would also
    survive a race; making them first keeps the threads from racing at all)."""
    for backend in ("legacy", "nft"):
        for drop in DROPS:
            path_without(backend, workdir, drop)


@dataclass(frozen=True)
class NodeNet:
    """Addresses of node `index`: 192.168.6<index>.10/24 and fd00:6<index>::10/64 on eth0.

    `tag` names the node's kube-proxy releases in its namespace (`rk137-nft-ds`); `ipv6` False
    disables IPv6 in the namespace (`net.ipv6.conf.all.disable_ipv6=1`: no ip6 family at all);
    `ipv4` False makes an IPv6-only node (single-stack IPv6 cluster): eth0, the routes, the
    local pod and the API server's forwarder have IPv6 addresses only (the kernel keeps IPv4,
    and lo its 127.0.0.1, as on any IPv6-only node)."""

    index: int
    backend: str  # legacy | nft
    dual_stack: bool
    tag: str = ""
    ipv6: bool = True
    ipv4: bool = True

    @property
    def ns(self) -> str:
        stack = "ds" if self.dual_stack else ("v4" if self.ipv6 else "v4no6")
        stack = stack if self.ipv4 else "v6"
        return f"rk{self.tag}-{self.backend}-{stack}"

    @property
    def name(self) -> str:  # the Node's name (--hostname-override)
        return f"node-{self.index}"

    @property
    def peer_link(self) -> str:
        return f"rkpeer{self.index}"

    @property
    def v4(self) -> str:
        return f"192.168.{60 + self.index}.10"

    @property
    def v4_peer(self) -> str:
        return f"192.168.{60 + self.index}.1"

    @property
    def v6(self) -> str:
        return f"fd00:{60 + self.index}::10"

    @property
    def v6_peer(self) -> str:
        return f"fd00:{60 + self.index}::1"

    @property
    def families(self) -> tuple[str, ...]:
        if not self.ipv4:
            return ("ipv6",)
        return ("ipv4", "ipv6") if self.dual_stack else ("ipv4",)

    @property
    def node_ips(self) -> tuple[str, ...]:
        if not self.ipv4:
            return (self.v6,)
        return (self.v4, self.v6) if self.dual_stack else (self.v4,)

    @property
    def has_v6(self) -> bool:
        """IPv6 addresses on eth0 (dual-stack or IPv6-only)."""
        return self.dual_stack or not self.ipv4

    @property
    def addr(self) -> str:
        """The node's primary IP."""
        return self.v4 if self.ipv4 else self.v6

    @property
    def peer(self) -> str:
        """The veth peer's address of the primary family: the API server's forwarder."""
        return self.v4_peer if self.ipv4 else self.v6_peer

    @property
    def api_host(self) -> str:
        return self.peer if self.ipv4 else f"[{self.peer}]"


def ns_run(ns: str, *args: str, stdin: str | None = None, check: bool = True) -> str:
    return sh(["ip", "netns", "exec", ns, *args], stdin=stdin, check=check)


LISTENER = r"""
import socket, sys, threading
def serve(fam, addr):
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if fam == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind((addr, int(sys.argv[1]))); s.listen(64)
    while True:
        c, _ = s.accept(); c.sendall(b"ok\n"); c.close()
ts = [threading.Thread(target=serve, args=(socket.AF_INET, "0.0.0.0"))]
if len(sys.argv) > 2:
    ts.append(threading.Thread(target=serve, args=(socket.AF_INET6, "::")))
for t in ts: t.start()
print("listening", flush=True)
for t in ts: t.join()
"""


def setup_namespace(net: NodeNet) -> subprocess.Popen[bytes]:
    """The namespace with eth0 (peer in the VM's root namespace), lo up, pod routes and the
    endpoint listener. Returns the listener process."""
    sh(["ip", "netns", "del", net.ns], check=False)
    sh(["ip", "link", "del", net.peer_link], check=False)
    sh(["ip", "netns", "add", net.ns])
    ip = ["ip", "-n", net.ns]
    if not net.ipv6:
        # the namespace's own sysctl: an IPv4-only node without IPv6
        ns_run(net.ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
        ns_run(net.ns, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")
    sh([*ip, "link", "set", "lo", "up"])
    sh(
        [
            "ip",
            "link",
            "add",
            net.peer_link,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            net.ns,
        ]
    )
    if net.ipv4:
        sh(["ip", "addr", "add", f"{net.v4_peer}/24", "dev", net.peer_link])
        sh([*ip, "addr", "add", f"{net.v4}/24", "dev", "eth0"])
        # Local pods: addresses on lo, so a DNAT to them is delivered to the listener.
        sh([*ip, "addr", "add", "10.244.0.10/32", "dev", "lo"])
    if net.has_v6:
        sh(["ip", "addr", "add", f"{net.v6_peer}/64", "dev", net.peer_link, "nodad"])
        sh([*ip, "addr", "add", f"{net.v6}/64", "dev", "eth0", "nodad"])
        sh([*ip, "addr", "add", "fd00:244::10/128", "dev", "lo"])
    sh(["ip", "link", "set", net.peer_link, "up"])
    sh([*ip, "link", "set", "eth0", "up"])
    # Remote pods live behind the peer (IPVS wants a unicast route to every real server).
    if net.ipv4:
        sh([*ip, "route", "add", "default", "via", net.v4_peer])
    if net.has_v6:
        sh([*ip, "-6", "route", "add", "default", "via", net.v6_peer])
    args = ["ip", "netns", "exec", net.ns, "python3", "-c", LISTENER, str(LISTEN_PORT)]
    if net.has_v6:
        args.append("v6")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    proc.stdout.readline()
    return proc


def delete_namespace(net: NodeNet) -> None:
    sh(["ip", "netns", "del", net.ns], check=False)
    sh(["ip", "link", "del", net.peer_link], check=False)


_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNET = 0x40000000


def in_netns(ns: str, fn: Callable[[], T]) -> T:
    """Run `fn` in a fresh thread that joined namespace `ns` (setns acts on one thread only),
    so sockets it opens live there. Cheaper than a Python start in the namespace under TCG."""
    box: list[Any] = []

    def body() -> None:
        try:
            with open(f"/run/netns/{ns}") as f:
                if _libc.setns(f.fileno(), CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns {ns}")
            box.append((True, fn()))
        except BaseException as exc:  # handed to the caller's thread
            box.append((False, exc))

    t = threading.Thread(target=body)
    t.start()
    t.join()
    ok, value = box[0]
    if not ok:
        raise value
    return cast(T, value)


def probe(net: NodeNet, host: str, port: int) -> str:
    """A real TCP connection from the namespace; 'ok' when the endpoint listener answered."""

    def connect() -> str:
        try:
            with socket.create_connection((host, port), timeout=5) as s:
                s.settimeout(5)
                return s.recv(16).decode().strip() or "empty"
        except OSError as exc:
            return f"error {exc}"

    return in_netns(net.ns, connect)


def http_get(ns: str, url: str) -> tuple[int, str]:
    """GET inside the namespace."""

    def get() -> tuple[int, str]:
        try:
            with _OPENER.open(url, timeout=10) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as e:
            return int(e.code), e.read().decode()
        except OSError as e:
            return 0, str(e)

    return in_netns(ns, get)


def base_flags(kubeconfig: Path, node: str, mode: str, cluster_cidr: str) -> list[str]:
    """The flags that work for kube-proxy in a network namespace (kube-proxy --help; conntrack
    sysctls are host-wide): no conntrack sysctls, JSON to the fake API server, loopback listeners."""
    return [
        f"--kubeconfig={kubeconfig}",
        f"--hostname-override={node}",
        f"--proxy-mode={mode}",
        f"--cluster-cidr={cluster_cidr}",
        "--metrics-bind-address=127.0.0.1:10249",
        "--healthz-bind-address=127.0.0.1:10256",
        "--kube-api-content-type=application/json",
        "--conntrack-max-per-core=0",
        "--conntrack-tcp-timeout-established=0",
        "--conntrack-tcp-timeout-close-wait=0",
        "--oom-score-adj=0",
        "-v=2",
    ]


@functools.cache
def release(binary: Path) -> tuple[int, int]:
    """kube-proxy's (major, minor), from `kube-proxy --version` ("Kubernetes v1.37.2")."""
    out = sh([str(binary), "--version"]).split()[-1].lstrip("v")
    major, minor = out.split(".")[:2]
    return int(major), int(minor)


@dataclass
class KubeProxy:
    """Real kube-proxy in a namespace, started by `start` and stopped by `stop`.

    `kubeconfig` is the text of its kubeconfig (tests/realkp/cluster.py: the node's real API
    server as user system:kube-proxy); `binary` the release that runs unless `start` names
    another (the upgrade scenario runs ipvs mode on one release and nftables mode on the next)."""

    net: NodeNet
    binary: Path
    workdir: Path
    kubeconfig: str
    mode: str = ""
    running: Path | None = None  # the binary of the current or last start
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    timings: dict[str, float] = field(default_factory=dict)
    shape: Shape = field(default_factory=Shape)
    last_seen: str = "nothing read yet"  # what the last poll of a wait saw, for its give-up

    def args(self, mode: str, binary: Path | None = None) -> list[str]:
        kubeconfig = self.workdir / f"{self.net.ns}.kubeconfig"
        kubeconfig.write_text(self.kubeconfig)
        v4, v6 = self.net.ipv4, self.net.has_v6
        cidrs = ",".join(["10.244.0.0/16"] * v4 + ["fd00:244::/56"] * v6)
        pinned = [f"{self.net.v4}/32"] * v4 + [f"{self.net.v6}/128"] * v6
        nodeport = pinned if self.shape.pinned_node_ports else []
        # A keepalived-style virtual server beside kube-proxy, as an operator keeps it.
        vip = (
            f"192.168.{60 + self.net.index}.100/32"
            if v4
            else f"fd00:{60 + self.net.index}::100/128"
        )
        exclude = [vip]
        binary = binary or self.binary
        if self.shape.kubeadm:
            doc = config_document(
                mode=mode,
                node=self.net.name,
                cluster_cidr=cidrs,
                exclude_cidrs=exclude,
                shape=self.shape,
                node_port_addresses=nodeport,
            )
            root = self.workdir / f"{self.net.ns}-root"
            return kubeadm_command(root, binary, doc, self.kubeconfig, self.net.name)
        # nftables mode needs its gate before v1.31 (beta, on by default from then, GA in v1.33)
        gate = ["--feature-gates=NFTablesProxyMode=true"] if release(binary) < (1, 31) else []
        return [
            str(binary),
            *base_flags(kubeconfig, self.net.name, mode, cidrs),
            *gate,
            *([f"--nodeport-addresses={','.join(nodeport)}"] if nodeport else []),
            *(["--ipvs-strict-arp"] if self.shape.strict_arp else []),
            f"--ipvs-exclude-cidrs={exclude[0]}",
        ]

    def env(self, modprobe: bool = True, ipset: bool = True) -> dict[str, str]:
        drop = tuple(p for p, keep in (("ipset", ipset), ("modprobe", modprobe)) if not keep)
        path = (
            path_without(self.net.backend, self.workdir, drop)
            if drop
            else f"{tool_dir(self.net.backend, self.workdir)}:/usr/sbin:/usr/bin:/sbin:/bin"
        )
        return {"PATH": path, "HOME": "/root"}

    def start(self, mode: str, binary: Path | None = None, modprobe: bool = True) -> None:
        """Start `mode` (with `binary` instead of the node's release if given); `modprobe`
        False starts it with no `modprobe` on its PATH, as in an image that lacks it."""
        self.mode = mode
        self.running = binary or self.binary
        self.log = self.workdir / f"{self.net.ns}-{mode}-{int(time.time())}.log"
        with open(self.log, "wb") as logf:
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", self.net.ns, *self.args(mode, binary)],
                stdout=logf,
                stderr=subprocess.STDOUT,
                # ipvs mode needs ipset; a node whose image lacks it runs every other mode
                env=self.env(modprobe, ipset=self.shape.ipset or mode == "ipvs"),
                start_new_session=True,
            )
        self.started = time.monotonic()

    def run_cleanup(self) -> tuple[int, str]:
        """`kube-proxy --cleanup` (its own removal of iptables/ipvs/nftables-mode state)."""
        args = [a for a in self.args("ipvs") if not a.startswith("--proxy-mode")]
        p = subprocess.run(
            ["ip", "netns", "exec", self.net.ns, *args, "--cleanup"],
            capture_output=True,
            text=True,
            env=self.env(ipset=self.shape.ipset),
            timeout=300,
        )
        return p.returncode, (p.stdout + p.stderr)[-4000:]

    def metrics(self) -> str:
        return http_get(self.net.ns, "http://127.0.0.1:10249/metrics")[1]

    def synced(self) -> bool:
        """Every family's proxier finished a first full sync. The sync metrics carry no family
        label in v1.30 (one family's sync sets them), and /healthz answers 200 before any sync,
        so each family's last write of its sync is looked for in the kernel as well."""
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"kube-proxy {self.mode} exited: {self.tail()}")
        families = self.families()
        count = self._sync_count()
        self.last_seen = f"{count:g} syncs of {len(families)} families"
        if count < len(families):
            return False
        code = http_get(self.net.ns, "http://127.0.0.1:10256/healthz")[0]
        self.last_seen += f"; /healthz {code}"
        if code != 200:
            return False
        missing = [f for f in families if not self._family_synced(f)]
        self.last_seen += f"; no last write yet of {missing}" if missing else ""
        return not missing

    def families(self) -> tuple[str, ...]:
        """kube-proxy runs both families whenever ip6tables works, IPv4-only node or not."""
        return ("ipv4", "ipv6") if "running in dual-stack mode" in self.tail(None) else ("ipv4",)

    def _family_synced(self, family: str) -> bool:
        ns = self.net.ns
        if self.mode == "nftables":
            table = "ip6 kube-proxy" if family == "ipv6" else "ip kube-proxy"
            return f"table {table}\n" in ns_run(ns, "nft", "list", "tables") + "\n"
        tool = f"{'ip6tables' if family == 'ipv6' else 'iptables'}-{self.net.backend}-save"
        nat = ns_run(ns, tool, "-t", "nat", check=False)
        if self.mode == "ipvs":
            # written by the iptables-restore that follows a sync's IPVS and ipset work
            loopback = "::1/128" if family == "ipv6" else "127.0.0.0/8"
            return f"-A KUBE-SERVICES -s {loopback} -j RETURN" in nat
        return "-j KUBE-NODEPORTS" in nat  # iptables mode: the last rule of KUBE-SERVICES

    def wait_synced(self, timeout: float = 600.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.synced():
                took = time.monotonic() - self.started
                self.timings[self.mode] = took
                if self.mode == "ipvs":
                    self._wait_settled(deadline)
                return took
            time.sleep(4)  # each poll starts processes: keep them rare under TCG
        raise RuntimeError(
            f"kube-proxy {self.mode} not synced after {timeout}s; last seen: {self.last_seen}; "
            f"its log: {self.tail()}"
        )

    def _sync_count(self) -> float:
        """Syncs of every family so far (one metric for all of them in v1.30); 0 before any."""
        return sum(
            float(line.split()[-1])
            for line in self.metrics().splitlines()
            if line.startswith("kubeproxy_sync_proxy_rules_duration_seconds_count")
        )

    def _ipvs_state(self) -> str:
        return ns_run(self.net.ns, "ipset", "save") + ns_run(self.net.ns, "sh", "-c", IPVSADM_SAVE)

    def _wait_settled(self, deadline: float) -> None:
        """Until a further sync of every family changes neither the sets nor IPVS.

        ipvs mode adds each set member with its own `ipset add`; one that fails (logged, not
        retried until the next sync) leaves a virtual server without the member that names it
        as kube-proxy's (a CI run lost six under load). The periodic resync (30 s) adds it: the
        state the tests take is the one a resync no longer changes."""
        families = len(self.families())
        count, state = self._sync_count(), self._ipvs_state()
        while time.monotonic() < deadline:
            time.sleep(4)
            synced = self._sync_count()
            if synced < count + families:
                continue
            count, now = synced, self._ipvs_state()
            if now == state:
                return
            failed = [line for line in self.tail(None).splitlines() if "Failed to" in line]
            print(f"{self.net.ns}: a resync changed the ipvs state; kube-proxy: {failed[-3:]}")
            state = now
        raise RuntimeError(
            f"kube-proxy ipvs: the sets or IPVS still change ({self._sync_count():g} syncs, "
            f"{len(state.splitlines())} lines of sets and IPVS, changed by the last resync); {self.tail()}"
        )

    def tail(self, chars: int | None = 3000) -> str:
        text = self.log.read_text(errors="replace") if self.log else ""
        return text[-chars:] if chars else text

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def endpoints(ns: str) -> dict[str, Any]:
    """What kube-proxy serves on its four endpoints, raw."""
    out: dict[str, Any] = {}
    for name, url in (
        ("proxyMode", "http://127.0.0.1:10249/proxyMode"),
        ("healthz", "http://127.0.0.1:10256/healthz"),
        ("livez", "http://127.0.0.1:10256/livez"),
        ("metrics", "http://127.0.0.1:10249/metrics"),
    ):
        code, body = http_get(ns, url)
        out[name] = {"status": code, "body": body}
    return out


def save_json(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, sort_keys=True))


def copy_out(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(src, dst)
