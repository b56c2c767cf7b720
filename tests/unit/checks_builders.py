"""What the precheck and verify tests build: kube-proxy's configuration, snapshots of a node,
and how to run verify."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agent.classify import classify
from agent.cleanup.plan import make_plan
from agent.readers.kube_proxy_config import KubeProxyConfig
from agent.snapshot import (
    Ipset,
    IpvsDest,
    IpvsService,
    Kernel,
    KubeProxy,
    Link,
    Links,
    Reading,
    Snapshot,
)
from agent.views import checks
from agent.views.checks import Check, ProbeResult
from tests.unit.builders import NOW, kube_proxy, ok, snapshot

KUBEADM_CONFIG = """\
apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: "wlc"   # set by the platform team
  strictARP: true
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: ""
mode: "ipvs"
nodePortAddresses:
- 192.168.50.0/24
- primary
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
"""

NODE = Links(kube_ipvs0=None, node_addresses=("192.168.50.10", "fd00:50::10"))


def cfg(**kw: Any) -> Reading[KubeProxyConfig | None]:
    origins = {k: f"{k} in test" for k in kw}
    return Reading("ok", KubeProxyConfig(origin="test", origins=origins, **kw))


NO_CONFIG: Reading[KubeProxyConfig | None] = Reading("absent", None, "no kube-proxy process")


def snap(
    release: str = "6.1.0",
    sysctls: dict[str, str] | None = None,
    links: Links = NODE,
    kp: KubeProxy | None = None,
    **kw: Any,
) -> Snapshot:
    s = snapshot(links=links, kp=kp, **kw)
    return replace(s, kernel=ok(Kernel(release=release, sysctls=sysctls or {})))


def with_metrics(kp: KubeProxy, **changes: Any) -> KubeProxy:
    assert kp.metrics.data is not None
    return replace(kp, metrics=ok(replace(kp.metrics.data, **changes)))


def one(result: list[Check], name: str) -> Check:
    (c,) = [c for c in result if c.name == name]
    return c


PROBE_OK = ProbeResult("10.96.0.1:443", "--probe-address", True, "connected in 0.001s")


def nft_snap(kp: KubeProxy | None = None, **kw: Any) -> Snapshot:
    from agent.names import NFTABLES_MODE_CHAINS
    from agent.snapshot import NftTable

    s = snap(kp=kp or kube_proxy("nftables", ("ipv4", "ipv6")), **kw)
    own = NFTABLES_MODE_CHAINS
    tables = (
        NftTable("ip", "kube-proxy", kube_proxy_chains=own),
        NftTable("ip6", "kube-proxy", kube_proxy_chains=own),
    )
    # a node where nothing left IPv4 forwarding on (the ip-forward check passes)
    kernel = replace(s.kernel.data, sysctls={"net.ipv4.ip_forward": "0", **s.kernel.data.sysctls})
    return replace(s, nftables=ok(tables), kernel=ok(kernel))


def run_verify(s: Snapshot, probe: ProbeResult = PROBE_OK) -> list[Check]:
    c = classify(s, NOW)
    return checks.verify(s, c, make_plan(s, c).kept_reasons(), probe, NOW, 0.0)


# kube-proxy's virtual server, a keepalived one, kube-ipvs0 with its address, and the set that
# names it
KUBE_VS = IpvsService(
    4, "TCP", "10.96.0.1", 443, None, "rr", 0, 0, (IpvsDest("10.0.0.2", 6443, "masq", 1),)
)
KEEPALIVED = IpvsService(
    4,
    "TCP",
    "192.168.50.100",
    80,
    None,
    "wlc",
    0,
    0,
    (IpvsDest("192.168.60.11", 80, "route", 1),) * 2,
)
BOUND = Links(Link("kube-ipvs0", 9, "dummy", False, ("10.96.0.1/32",)), ("192.168.50.10",))
# kube-proxy's record of KUBE_VS's address and port (docs/contract.md#ownership evidence)
CLUSTER_IP = (Ipset("KUBE-CLUSTER-IP", "hash:ip,port", 4, 1, 0, ("10.96.0.1,tcp:443",)),)
