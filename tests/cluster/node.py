"""The cluster tier's node: the VM itself (scripts/vm-run --user-net), set up as an operator sets
up a worker: containerd (with runc and the CNI plugins) and the kubelet, joined to the control
plane that tests/cluster/launch.py runs on the host, and real kube-proxy in the node's network
namespace (the VM's own), first in ipvs mode, then in nftables mode without `modprobe`: the
real-kube-proxy tier's scenario B, so the node carries a real migration's leftovers.

Every program is the project's build (scripts/build-upstream), read from the host's cache. The
state containerd and the kubelet keep is on tmpfs mounts of their own (the guest's /var is an
overlay, which overlayfs refuses as the upper layer of its snapshots). Only in the VM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster.monitor import GuestMonitor
from tests.control_plane import KUBERNETES_VERSION
from tests.realkp import state as st
from tests.realkp.node import KubeProxy, NodeNet, make_shared_tools, sh
from tests.upstream import REPO, upstream_binary

NODE_NAME = "node-0"  # tests/cluster/launch.py's kubelet identity names it
NODE_IP = "10.0.2.15"  # QEMU's user network gives the guest this address
NETNS = "node"  # `ip netns` name of the VM's own namespace (kube-proxy runs with `ip netns exec`)
POD_CIDR = "10.244.0.0/24"
CLUSTER_CIDR = "10.244.0.0/16"
CONTAINERD_VERSION = "v2.4.2"
RUNC_VERSION = "v1.5.3"
CNI_VERSION = "v1.10.0"
CNI_PLUGINS = ("bridge", "host-local", "loopback")
SOCKET = "/run/containerd/containerd.sock"
KUBECTL = str(Path(sys.executable).with_name("kubectl"))
MODULES = ("ip_vs", "ip_vs_rr", "ip_vs_wlc", "ip_vs_sh", "dummy", "nf_conntrack", "overlay",
           "bridge", "br_netfilter", "veth")  # fmt: skip
STATE_DIRS = ("/var/lib/containerd", "/var/lib/kubelet", "/var/lib/cni")


@dataclass(frozen=True)
class VMNode(NodeNet):
    """The VM as the node: its own namespace, its eth0 address, the Node's name."""

    @property
    def ns(self) -> str:
        return NETNS

    @property
    def name(self) -> str:
        return NODE_NAME

    @property
    def v4(self) -> str:
        return NODE_IP


def out_dir() -> Path:
    """Where the tier keeps what it writes, on the host's side of the VM (VM_OUT): the node's
    logs go there as they are written, so that a stalled or killed run keeps them."""
    d = Path(os.environ.get("VM_OUT", "/tmp")) / "cluster-node"
    d.mkdir(parents=True, exist_ok=True)
    return d


def control_plane_dir() -> Path:
    d = Path(os.environ.get("VM_OUT", "/tmp")) / "cluster"
    if not (d / "control-plane.json").exists():
        raise RuntimeError(
            "no control plane: the tier runs under `python -m tests.cluster.launch --dir "
            "$VM_OUT/cluster -- scripts/vm-run --user-net ...` (scripts/test --tier cluster)"
        )
    return d


# A workload's Service beside `kubernetes`, so ipvs mode leaves more than one virtual server: a
# NodePort Service with an endpoint on the node's pod network (selector-less, its EndpointSlice
# written as a controller would).
WEB: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "List",
    "items": [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {
                "type": "NodePort",
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}],
            },
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "web-1",
                "namespace": "default",
                "labels": {"kubernetes.io/service-name": "web"},
            },
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["10.244.0.99"], "conditions": {"ready": True}, "nodeName": NODE_NAME}
            ],
        },
    ],
}


def containerd_config(bin_dir: Path, cni_bin: Path, sandbox: str) -> str:
    """containerd 2.x's config (version 3): CRI with runc under cgroupfs (the guest has no
    systemd), the project's sandbox image, the CNI plugins' folder."""
    runc = upstream_binary("runc", RUNC_VERSION)
    return f"""version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "{SOCKET}"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{sandbox}"
[plugins.'io.containerd.cri.v1.runtime']
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "/etc/cni/net.d"
"""


CNI_CONFLIST = {
    "cniVersion": "1.0.0",
    "name": "pods",
    "plugins": [
        {
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": True,
            "ipMasq": True,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": POD_CIDR}]],
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        }
    ],
}


def kubelet_config(ca: Path) -> str:
    """The KubeletConfiguration: cgroupfs (as containerd's runc), x509 clients of the cluster's
    CA, eviction thresholds a tmpfs-backed lab node does not trip."""
    return json.dumps(
        {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs",
            "containerRuntimeEndpoint": f"unix://{SOCKET}",
            "failSwapOn": False,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(ca)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "evictionHard": {
                "memory.available": "50Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "resolvConf": "/etc/resolv.conf",
            "podCIDR": POD_CIDR,
        },
        indent=1,
    )


def _wait(what: str, probe: Any, timeout: float, every: float = 2.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(every)
    raise RuntimeError(f"{what}: not within {timeout:g} s; last: {str(last)[-1500:]}")


@dataclass
class Node:
    """containerd + kubelet in the VM, and real kube-proxy; `start()` then `stop()`."""

    work: Path
    cp: Path = field(default_factory=control_plane_dir)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    images: dict[str, str] = field(default_factory=dict)
    net: VMNode = field(default_factory=lambda: VMNode(0, "nft", False))
    kube_proxy: KubeProxy | None = None
    states: dict[str, st.State] = field(default_factory=dict)
    made_ipvs: set[str] = field(default_factory=set)
    monitor: GuestMonitor | None = None
    unready_since: float | None = None  # when check_healthy first saw the Node not Ready

    # -- the operator's tools ----------------------------------------------------------------

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        cmd = [KUBECTL, f"--kubeconfig={self.cp / 'guest-admin.kubeconfig'}", *args]
        p = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=300)
        if check and p.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} -> {p.returncode}: {p.stderr[-2000:]}")
        return p.stdout

    def ctr(self, *args: str, timeout: float = 300.0) -> str:
        ctr = upstream_binary("ctr", CONTAINERD_VERSION)
        p = subprocess.run(
            [str(ctr), "--address", SOCKET, "-n", "k8s.io", *args],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if p.returncode != 0:
            raise RuntimeError(
                f"ctr {' '.join(args)} -> {p.returncode}: {p.stderr.strip()[-2000:]}"
            )
        return p.stdout

    def log(self, name: str) -> Path:
        return out_dir() / f"{name}.log"

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        with open(self.log(name), "ab") as f:
            self.procs[name] = subprocess.Popen(
                args, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})}, start_new_session=True,
            )  # fmt: skip

    def _alive(self, name: str) -> bool:
        p = self.procs[name]
        if p.poll() is not None:
            tail = self.log(name).read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{name} exited {p.returncode}: {tail}")
        return True

    # -- bring-up ----------------------------------------------------------------------------

    def start(self) -> None:
        t0 = time.monotonic()
        self.work.mkdir(parents=True, exist_ok=True)
        self.monitor = GuestMonitor(out_dir() / "guest-monitor.log")
        self.monitor.start()
        sh(["modprobe", "-a", *MODULES])
        for d in STATE_DIRS:
            Path(d).mkdir(parents=True, exist_ok=True)
            sh(["mount", "-t", "tmpfs", "-o", "mode=0711", "tmpfs", d])
        # the VM's own namespace under a name, as the realkp helpers address a node's
        sh(["ip", "netns", "attach", NETNS, "1"])
        self._start_containerd()
        self._import_images()
        self._start_kubelet()
        self.timings["node ready"] = time.monotonic() - t0

    def _start_containerd(self) -> None:
        t0 = time.monotonic()
        tools = self.work / "bin"
        cni_bin = self.work / "cni-bin"
        for d in (tools, cni_bin):
            d.mkdir(exist_ok=True)
        # the shim is found on containerd's PATH, runc by the path in the config
        shim = upstream_binary("containerd-shim-runc-v2", CONTAINERD_VERSION)
        (tools / shim.name).symlink_to(shim)
        for plugin in CNI_PLUGINS:
            (cni_bin / plugin).symlink_to(upstream_binary(plugin, CNI_VERSION))
        Path("/etc/cni/net.d").mkdir(parents=True, exist_ok=True)
        Path("/etc/cni/net.d/10-pods.conflist").write_text(json.dumps(CNI_CONFLIST, indent=1))
        self.images = json.loads((self.cp / "images.json").read_text())
        config = self.work / "containerd.toml"
        config.write_text(containerd_config(tools, cni_bin, self.images["pause"]))
        containerd = upstream_binary("containerd", CONTAINERD_VERSION)
        path = f"{tools}:/usr/sbin:/usr/bin:/sbin:/bin"
        self._spawn("containerd", [str(containerd), "--config", str(config)], {"PATH": path})
        _wait("containerd serving", lambda: self._alive("containerd") and self.ctr("version"), 120)
        self.timings["containerd"] = time.monotonic() - t0

    def _import_images(self) -> None:
        """The archives tests/cluster/launch.py wrote, imported as an operator loads an image
        onto a node; the agent's under the reference the base renders."""
        t0 = time.monotonic()
        for name in ("pause", "agent"):
            # 133 MB of gzip layers over 9p, unpacked under emulation: 220 s on a loaded host
            self.ctr("images", "import", str(self.cp / "images" / f"{name}.oci.tar"), timeout=1200)
        self.timings["import"] = time.monotonic() - t0

    def tag(self, source: str, ref: str) -> None:
        self.ctr("images", "tag", "--force", source, ref)

    def _start_kubelet(self) -> None:
        t0 = time.monotonic()
        config = self.work / "kubelet.json"
        config.write_text(kubelet_config(self.cp / "ca.crt"))
        kubelet = upstream_binary("kubelet", KUBERNETES_VERSION)
        self._spawn("kubelet", [
            str(kubelet), f"--config={config}", f"--kubeconfig={self.cp / 'kubelet.kubeconfig'}",
            f"--hostname-override={NODE_NAME}", f"--node-ip={NODE_IP}",
            f"--cert-dir={self.work / 'kubelet-pki'}", "--v=2",
        ])  # fmt: skip

        def ready() -> bool:
            self._alive("kubelet")
            out = self.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
            if not out:
                return False
            conds = {c["type"]: c["status"] for c in json.loads(out)["status"]["conditions"]}
            return conds.get("Ready") == "True"

        _wait("the Node Ready", ready, 300, every=3)
        self.timings["kubelet"] = time.monotonic() - t0

    # -- health: a wait that would outlast a dead node says so at once ----------------------

    def node_problem(self) -> str | None:
        """None while the kubelet runs and the Node is Ready; else what is wrong."""
        p = self.procs.get("kubelet")
        if p is not None and p.poll() is not None:
            return f"the kubelet exited {p.returncode}"
        doc = json.loads(self.kubectl("get", "node", NODE_NAME, "-o", "json"))
        conds = {c["type"]: c for c in doc["status"]["conditions"]}
        ready = conds.get("Ready", {})
        if ready.get("status") == "True":
            return None
        return (
            f"the Node is Ready={ready.get('status')} since {ready.get('lastTransitionTime')} "
            f"({ready.get('reason')}: {ready.get('message')}); its last heartbeat "
            f"{ready.get('lastHeartbeatTime')}"
        )

    def check_healthy(self, grace: float = 120.0) -> None:
        """Raise, with the kubelet's last lines and what the guest spent its CPU on, once the
        node has been unhealthy for `grace` seconds: a Node that stopped posting its status
        (CI12) can make no Pod Ready, and a wait for one would only use up its deadline. A
        shorter lapse (a loaded host can delay a few of the kubelet's posts) is waited out."""
        problem = self.node_problem()
        now = time.monotonic()
        if problem is None:
            self.unready_since = None
            return
        self.unready_since = self.unready_since or now
        if now - self.unready_since < grace:
            return
        kubelet = self.log("kubelet").read_text(errors="replace").splitlines()[-30:]
        monitor = self.monitor.tail() if self.monitor else "(no guest monitor)"
        raise RuntimeError(
            f"node {NODE_NAME} unhealthy for {now - self.unready_since:.0f} s: {problem}\n"
            f"the kubelet's last lines:\n" + "\n".join(kubelet) + f"\nthe guest:\n{monitor}"
        )

    def wait(
        self, what: str, ready: Callable[[], bool], timeout: float,
        describe: Callable[[], str] = lambda: "", every: float = 3.0,
    ) -> None:  # fmt: skip
        """ready() every `every` s until true, the node's health checked every 30 s on the way
        (check_healthy); gives up after `timeout` s with what describe() says then."""
        deadline = time.monotonic() + timeout
        checked = time.monotonic()
        while not ready():
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{what}: not within {timeout:g} s; {describe()}")
            if time.monotonic() - checked >= 30:
                self.check_healthy()
                checked = time.monotonic()
            time.sleep(every)

    # -- the migration -----------------------------------------------------------------------

    def migrate(self) -> st.State:
        """Real kube-proxy: ipvs mode until synced and settled, stopped; then nftables mode
        without `modprobe` on its PATH (scenario B: from v1.34 its start-up cleanup of ipvs
        mode's state returns at once). Returns the node's state as the agent meets it."""
        make_shared_tools(self.work)
        self.kubectl("apply", "-f", "-", stdin=json.dumps(WEB))
        binary = upstream_binary("kube-proxy", KUBERNETES_VERSION)
        kubeconfig = (self.cp / "kube-proxy.kubeconfig").read_text()
        kp = self.kube_proxy = KubeProxy(self.net, binary, self.work, kubeconfig)
        s0 = self.states["S0"] = st.read(self.net)
        t0 = time.monotonic()
        kp.start("ipvs")
        self.timings["ipvs synced"] = kp.wait_synced()
        kp.stop()
        s1 = self.states["S1"] = st.read(self.net)
        self.made_ipvs = st.created(s0, s1)
        kp.start("nftables", modprobe=False)
        self.timings["nftables synced"] = kp.wait_synced()
        self.timings["migration"] = time.monotonic() - t0
        b = self.states["B"] = st.read(self.net)
        return b

    def stop(self) -> None:
        if self.kube_proxy is not None:
            self.kube_proxy.stop()
        if self.monitor is not None:
            self.monitor.stop()
        for name in reversed(list(self.procs)):
            p = self.procs[name]
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def repo_path(*parts: str) -> Path:
    return REPO.joinpath(*parts)
