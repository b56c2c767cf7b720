"""Node shapes of the real-kube-proxy tier beyond the default one (tests/realkp/nodes.py).

The default node runs kube-proxy from flags, on the VM's root filesystem, with every tool on its
PATH and nodePortAddresses pinned to the node's /32 (and /128). A `Shape` changes that, the way
real nodes differ:

- `kubeadm`: kube-proxy configured by a KubeProxyConfiguration file (`--config`, kubeadm's
  ConfigMap mounted at /var/lib/kube-proxy), run from a root filesystem of its own (a chroot in
  a mount namespace of its own, as a container is): the file exists only there, so the agent
  reads it through /proc/PID/root or not at all. Its flags are kubeadm's: `--config` and
  `--hostname-override`.
- `strict_arp`: ipvs mode with `ipvs.strictARP: true` (MetalLB's and kube-vip's instructions),
  which sets net.ipv4.conf.all.arp_ignore=1 and arp_announce=2 (pkg/proxy/ipvs/proxier.go,
  sysctlArpIgnore/sysctlArpAnnounce via EnsureSysctl); no kube-proxy mode resets them.
- `pinned_node_ports` False: nodePortAddresses unset, upstream's default: ipvs mode makes a
  NodePort virtual server on every local address but kube-ipvs0's (loopback and IPv6
  link-local excepted; GetAllLocalAddressesExcept + isValidForSet).
- `ipset` False: no `ipset` on the PATH of nftables mode (and of `kube-proxy --cleanup`): ipvs
  mode's start-up cleanup then skips the sets silently (its `ipset --version` fails), so scenario
  A keeps both families' sets.

Only for the VM, like tests/realkp/node.py.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

CONFIG_DIR = "/var/lib/kube-proxy"  # kubeadm's mount of the kube-proxy ConfigMap
CONFIG = f"{CONFIG_DIR}/config.conf"
KUBECONFIG = f"{CONFIG_DIR}/kubeconfig.conf"
ROOT_BINARY = "/opt/bin/kube-proxy"
ARP = ("net.ipv4.conf.all.arp_ignore", "net.ipv4.conf.all.arp_announce")


@dataclass(frozen=True)
class Shape:
    kubeadm: bool = False
    strict_arp: bool = False
    pinned_node_ports: bool = True
    ipset: bool = True

    @property
    def tag(self) -> str:
        """A short suffix for the node's namespace name; empty for the default shape."""
        parts = [
            *(["kubeadm"] if self.kubeadm else []),
            *(["noipset"] if not self.ipset else []),
        ]
        return "-".join(parts)


# Run inside `ip netns exec NS unshare --mount --propagation private`: kube-proxy's own root,
# with the host's /usr, /etc and the kernel's file systems, its binary bound to ROOT_BINARY and
# nothing of the VM's /var: the ConfigMap's folder is the root's own.
_ENTER_ROOT = r"""
set -e
root=$1 binary=$2
shift 2
for d in usr etc dev proc sys run tmp; do mount --rbind "/$d" "$root/$d"; done
mount --bind "$binary" "$root/opt/bin/kube-proxy"
exec chroot "$root" "$@"
"""


def make_root(root: Path) -> None:
    """The folders and links of kube-proxy's root filesystem (once per node)."""
    for d in ("usr", "etc", "dev", "proc", "sys", "run", "tmp", "opt/bin", CONFIG_DIR[1:]):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / ROOT_BINARY[1:]).touch()
    for link in ("bin", "sbin", "lib", "lib64"):
        if not (root / link).is_symlink():
            (root / link).symlink_to(f"usr/{link}")


def config_document(
    *,
    mode: str,
    node: str,
    cluster_cidr: str,
    exclude_cidrs: list[str],
    shape: Shape,
    node_port_addresses: list[str],
) -> dict[str, object]:
    """kubeadm's KubeProxyConfiguration as the node's ConfigMap holds it, with what the tier
    needs in a namespace (the same values base_flags gives the flag-configured nodes)."""
    doc: dict[str, object] = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "bindAddress": "0.0.0.0",
        "clientConnection": {"kubeconfig": KUBECONFIG, "contentType": "application/json"},
        "clusterCIDR": cluster_cidr,
        "mode": mode,
        "ipvs": {"strictARP": shape.strict_arp, "excludeCIDRs": exclude_cidrs},
        "conntrack": {
            "maxPerCore": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "metricsBindAddress": "127.0.0.1:10249",
        "healthzBindAddress": "127.0.0.1:10256",
        "oomScoreAdj": 0,
        # kubeadm writes `nodePortAddresses: null` when unset
        "nodePortAddresses": node_port_addresses or None,
    }
    return doc


def kubeadm_command(
    root: Path, binary: Path, doc: dict[str, object], kubeconfig: str, node: str
) -> list[str]:
    """Write the ConfigMap's two files into the root and return the command (after `ip netns
    exec NS`) that runs kube-proxy there as kubeadm's DaemonSet does. JSON is YAML: kube-proxy
    reads either."""
    make_root(root)
    (root / CONFIG[1:]).write_text(json.dumps(doc, indent=1) + "\n")
    (root / KUBECONFIG[1:]).write_text(kubeconfig)
    return [
        "unshare", "--mount", "--propagation", "private",
        "sh", "-c", _ENTER_ROOT, "kube-proxy-root", str(root), str(binary),
        ROOT_BINARY, f"--config={CONFIG}", f"--hostname-override={node}", "-v=2",
    ]  # fmt: skip


def arp_sysctls(read: str) -> dict[str, str]:
    """`grep -H . /proc/sys/net/ipv4/conf/*/arp_*` -> {"net.ipv4.conf.all.arp_ignore": "1"...}:
    every interface's, so that a change anywhere but `all` shows too."""
    out: dict[str, str] = {}
    for line in read.splitlines():
        path, sep, value = line.partition(":")
        if sep and path.startswith("/proc/sys/"):
            out[path[len("/proc/sys/") :].replace("/", ".")] = value.strip()
    return out


def vm_has_no_config() -> bool:
    """The VM's own root has no kube-proxy ConfigMap: only /proc/PID/root can find it."""
    return not os.path.exists(CONFIG)
