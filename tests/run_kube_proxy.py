"""Run inside a test namespace: a fake API server and real kube-proxy in the given mode until it
has synced, then stop it (its rules stay). Needs tests/fake_apiserver.py (the real-kube-proxy
tier's fake API server).

python -m tests.run_kube_proxy BINARY MODE LOGFILE
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.fake_apiserver import Cluster, Endpoint, FakeAPIServer, Node, Port, Service

NODE = Node("node-a", ("192.168.50.10",), ("10.244.0.0/24",))
# One of each shape iptables mode writes: ClusterIP, NodePort with a local and a remote
# endpoint, LoadBalancer with source ranges, externalTrafficPolicy Local with a health check
# port, ExternalIP, and a Service without endpoints.
SERVICES = [
    Service(
        "kubernetes",
        ("10.96.0.1",),
        (Port(443, target_port=6443, name="https"),),
        endpoints=(Endpoint("192.168.50.2"),),
    ),
    Service(
        "web",
        ("10.96.4.20",),
        (Port(80, node_port=30080, name="http"),),
        type="NodePort",
        endpoints=(Endpoint("10.244.0.12", "node-a"), Endpoint("10.244.1.13")),
    ),
    Service(
        "lb",
        ("10.96.4.30",),
        (Port(80, node_port=31080, name="http"),),
        type="LoadBalancer",
        lb_ingress=("203.0.113.10",),
        lb_source_ranges=("198.51.100.0/24",),
        endpoints=(Endpoint("10.244.0.22", "node-a"),),
    ),
    Service(
        "edge",
        ("10.96.4.50",),
        (Port(443, node_port=30443, name="https"),),
        type="LoadBalancer",
        lb_ingress=("203.0.113.11",),
        external_traffic_policy="Local",
        health_check_node_port=32100,
        endpoints=(Endpoint("10.244.0.42", "node-a"), Endpoint("10.244.2.43")),
    ),
    Service(
        "ext",
        ("10.96.4.40",),
        (Port(8080, name="http"),),
        external_ips=("192.168.50.200",),
        endpoints=(Endpoint("10.244.0.32", "node-a"),),
    ),
    Service("empty", ("10.96.4.80",), (Port(80),)),
]


def main() -> None:
    binary, mode, logfile = sys.argv[1], sys.argv[2], sys.argv[3]
    with FakeAPIServer(Cluster(NODE, SERVICES)) as api, tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        kubeconfig.write_text(api.kubeconfig())
        args = [
            binary,
            f"--kubeconfig={kubeconfig}",
            "--hostname-override=node-a",
            f"--proxy-mode={mode}",
            "--cluster-cidr=10.244.0.0/16",
            "--metrics-bind-address=127.0.0.1:10249",
            "--healthz-bind-address=127.0.0.1:10256",
            "--kube-api-content-type=application/json",
            "--conntrack-max-per-core=0",
            "--conntrack-tcp-timeout-established=0",
            "--conntrack-tcp-timeout-close-wait=0",
            "--oom-score-adj=0",
            "-v=2",
        ]
        with open(logfile, "w") as log:
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
            try:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    time.sleep(0.5)
                    save = subprocess.run(["iptables-save"], capture_output=True, text=True)
                    if "SyncProxyRules complete" in Path(logfile).read_text() and (
                        mode != "iptables" or "KUBE-SVC-" in save.stdout
                    ):
                        break
                else:
                    sys.exit(f"kube-proxy did not sync within 60s; see {logfile}")
                time.sleep(2)  # the other family's proxier
            finally:
                proc.terminate()
                proc.wait(10)


if __name__ == "__main__":
    main()
