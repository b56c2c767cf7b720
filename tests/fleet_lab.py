"""A small real fleet for `fleet step`: lab nodes in throwaway network namespaces, each with
its leftovers, a fake kube-proxy and `serve`; the real Prometheus in this namespace scraping
them (through forwarders, below) on top of hold-down history backfilled with promtool; the
real etcd + kube-apiserver + kube-controller-manager (tests/control_plane.py) with one Node
object per lab node and the agent's namespace, quota, ServiceAccount and DaemonSet; and a
stand-in kubelet that runs each cleanup Job's Pod in its node's namespace and reports the
Pod's status, so that the real Job controller completes or fails the Job.

Forwarders: Prometheus listens on this namespace's 127.0.0.1 and each node's `serve` on its
own namespace's 127.0.0.1:9437. A forwarder listens on a free port of this namespace's
127.0.0.1 and connects each client to the node's 127.0.0.1:9437 from a thread that has entered
the node's namespace (setns affects that one thread): this machine's namespace is never
changed, no link is added to it.

The stand-in kubelet maps the Pod's hostPath volumes to folders under the node's host root,
as tests/image does for podman, by rewriting the container's arguments, and sets
XTABLES_LOCKFILE to the host root's /run/xtables.lock.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lab import build
from lab.kube_proxy import FakeKubeProxy, start_fake_kube_proxy
from lab.model import Node
from tests.conftest import AGENT, REPO
from tests.control_plane import ControlPlane
from tests.prometheus.fleet import rules_file
from tests.prometheus.history import AGENT_NAMESPACE, agent_pod, backfill, start_prometheus
from tests.relay import relay
from tests.serving import serving

CLONE_NEWNET = 0x40000000
IMAGE = "registry.example.net/ipvs-leftovers:fleet-test"
NAMESPACE = "ipvs-leftovers"


class Forwarder:
    """127.0.0.1:port here -> 127.0.0.1:target inside network namespace `ns`."""

    def __init__(self, ns: str, target: int) -> None:
        self.ns, self.target = ns, target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._requests: list[tuple[threading.Event, list[socket.socket]]] = []
        self._cv = threading.Condition()
        self._stop = False
        threading.Thread(target=self._connector, daemon=True).start()
        threading.Thread(target=self._accept, daemon=True).start()

    def _connector(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/run/netns/{self.ns}", os.O_RDONLY)
        if libc.setns(fd, CLONE_NEWNET) != 0:  # this thread only
            raise OSError(ctypes.get_errno(), "setns")
        os.close(fd)
        while True:
            with self._cv:
                while not self._requests and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
                done, out = self._requests.pop(0)
            with suppress(OSError):
                out.append(socket.create_connection(("127.0.0.1", self.target), timeout=5))
            done.set()

    def _connect(self) -> socket.socket | None:
        done, out = threading.Event(), []  # type: ignore[var-annotated]
        with self._cv:
            self._requests.append((done, out))
            self._cv.notify()
        done.wait(10)
        return out[0] if out else None

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._pump, args=(client,), daemon=True).start()

    def _pump(self, client: socket.socket) -> None:
        upstream = self._connect()
        if upstream is None:
            client.close()
            return
        relay(client, upstream, idle=30)

    def close(self) -> None:
        self._stop = True
        with self._cv:
            self._cv.notify_all()
        self.listener.close()


@dataclass
class LabNode:
    name: str
    spec: Node
    kube_proxy: dict[str, Any]
    zone: str = "zone-a"
    ns: str = ""
    host_root: Path = Path()
    kp: FakeKubeProxy | None = None
    port: int = 0  # the forwarder's


@dataclass
class FleetLab:
    cp: ControlPlane
    nodes: dict[str, LabNode]
    prom_url: str
    workdir: Path
    prometheus: subprocess.Popen[bytes] | None = None
    ran: dict[str, int] = field(default_factory=dict)  # pod name -> exit code

    def api(self, path: str) -> Any:
        import urllib.request

        with urllib.request.urlopen(f"{self.prom_url}{path}", timeout=20) as r:
            return json.loads(r.read())["data"]

    def query(self, expr: str) -> dict[str, float]:
        import urllib.parse

        data = self.api(f"/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
        return {r["metric"].get("node", ""): float(r["value"][1]) for r in data["result"]}

    def firing(self) -> set[tuple[str, str]]:
        return {
            (a["labels"]["alertname"], a["labels"].get("node", ""))
            for a in self.api("/api/v1/alerts")["alerts"]
            if a["state"] == "firing"
        }

    def jobs(self) -> dict[str, dict[str, Any]]:
        doc = json.loads(self.cp.kubectl("-n", NAMESPACE, "get", "jobs", "-o", "json"))
        return {j["metadata"]["name"]: j for j in doc["items"]}


def _apply_agent(cp: ControlPlane, extra_args: list[str]) -> None:
    """The namespace (setup/), and the base's core objects with the test image (no CRDs)."""
    cp.kubectl("apply", "-k", str(REPO / "daemonset" / "setup"))
    rendered = cp.kubectl("kustomize", str(REPO / "daemonset"))
    docs = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] in (
        "ServiceAccount", "ResourceQuota", "DaemonSet")]  # fmt: skip
    for d in docs:
        if d["kind"] == "DaemonSet":
            c = d["spec"]["template"]["spec"]["containers"][0]
            c["image"] = IMAGE
            c["args"] += extra_args
    cp.kubectl("apply", "-f", "-", stdin="\n---\n".join(yaml.safe_dump(d) for d in docs))


def _register(cp: ControlPlane, node: LabNode) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": {"kubernetes.io/os": "linux", "topology.kubernetes.io/zone": node.zone},
        },
    }
    cp.kubectl("apply", "-f", "-", stdin=json.dumps(body))


class StandInKubelet:
    """Runs each cleanup Pod's command in its node's namespace; reports the Pod's status."""

    def __init__(self, lab: FleetLab) -> None:
        self.lab = lab
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self._once()
            except Exception as exc:  # noqa: BLE001 - reported by the test's waits
                (self.lab.workdir / "kubelet.log").open("a").write(f"{exc!r}\n")

    def _once(self) -> None:
        doc = json.loads(
            self.lab.cp.kubectl(
                "-n", NAMESPACE, "get", "pods", "-l", "app.kubernetes.io/component=cleanup",
                "-o", "json",
            )
        )  # fmt: skip
        for pod in doc["items"]:
            name = pod["metadata"]["name"]
            if name in self.seen or pod.get("status", {}).get("phase") not in (None, "Pending"):
                continue
            self.seen.add(name)
            self._run(pod)

    def _run(self, pod: dict[str, Any]) -> None:
        node = self.lab.nodes[pod["spec"]["nodeName"]]
        (c,) = pod["spec"]["containers"]
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        mapped: dict[str, str] = {}
        for m in c.get("volumeMounts", []):
            hp = volumes[m["name"]].get("hostPath")
            if hp:
                local = node.host_root / hp["path"].lstrip("/")
                if hp.get("type") == "FileOrCreate":
                    local.parent.mkdir(parents=True, exist_ok=True)
                    local.touch()
                else:
                    local.mkdir(parents=True, exist_ok=True)
                mapped[m["mountPath"]] = str(local)
        args = []
        for a in c["args"]:
            for target, local in mapped.items():
                if a == target or a.startswith(target + "/"):
                    a = local + a[len(target) :]
            args.append(a)
        started = _iso()
        env = {**os.environ, "XTABLES_LOCKFILE": mapped.get("/run/xtables.lock", "")}
        p = subprocess.run(
            ["ip", "netns", "exec", node.ns, AGENT, *args],
            capture_output=True, text=True, timeout=600, env=env,
        )  # fmt: skip
        (self.lab.workdir / f"{pod['metadata']['name']}.log").write_text(p.stdout + p.stderr)
        self.lab.ran[pod["metadata"]["name"]] = p.returncode
        finished = _iso()
        terminated = {
            "exitCode": p.returncode,
            "reason": "Completed" if p.returncode == 0 else "Error",
            "startedAt": started,
            "finishedAt": finished,
        }
        status = {
            "status": {
                "phase": "Succeeded" if p.returncode == 0 else "Failed",
                "startTime": started,
                "containerStatuses": [
                    {
                        "name": c["name"], "image": c["image"], "imageID": "", "ready": False,
                        "restartCount": 0, "state": {"terminated": terminated},
                    }
                ],
            }
        }  # fmt: skip
        self.lab.cp.kubectl(
            "-n", NAMESPACE, "patch", "pod", pod["metadata"]["name"], "--subresource=status",
            "--type=merge", "-p", json.dumps(status),
        )  # fmt: skip

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(30)


def _iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _start_prometheus(
    lab: FleetLab, history: Callable[[float, dict[str, str]], str], lifetime: float = 1800
) -> None:
    work = lab.workdir / "prometheus"
    work.mkdir()
    # written now, so that the backfilled samples end where the scrapes begin (no gap), in the
    # very series the scrapes continue (same labels: no second series lingering for 5 minutes)
    instances = {n.name: f"127.0.0.1:{n.port}" for n in lab.nodes.values()}
    data = backfill(history(time.time(), instances), work)
    # Every `for:` 10s, scrapes every 5s with a 4.5s timeout: on a loaded machine a scrape cut
    # at a short deadline reports its unfinished sources as failed (source_up 0), which makes
    # that node ineligible for the moment and fires IPVSLeftoversSourceFailing.
    rules = rules_file(work / "ipvs-leftovers.rules.yaml", "10s")
    config = {
        "global": {"scrape_interval": "5s", "scrape_timeout": "4500ms",
                   "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{
            "job_name": "ipvs-leftovers",
            "static_configs": [
                {"targets": [f"127.0.0.1:{n.port}"],
                 "labels": {"node": n.name, "cluster": "lab", "namespace": AGENT_NAMESPACE,
                            "pod": agent_pod(n.name)}}
                for n in lab.nodes.values()
            ],
        }],
    }  # fmt: skip
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    lab.prometheus, lab.prom_url = start_prometheus(
        work / "prometheus.yml", data, work / "prometheus.log", lifetime
    )


@contextmanager
def fleet_lab(
    workdir: Path,
    nodes: list[LabNode],
    history: Callable[[float, dict[str, str]], str],
    ds_args: list[str] | None = None,
    apiserver_flags: tuple[str, ...] = (),
) -> Iterator[FleetLab]:
    """`history(now, instances)`: the OpenMetrics of the hold-down before `now` (when
    Prometheus starts), each node's series under the `instance` its scrapes will have.
    `apiserver_flags`: added to kube-apiserver's (an audit log, for one)."""
    with ExitStack() as stack:
        cp = stack.enter_context(
            ControlPlane(workdir / "cp", controller_manager=True, apiserver_flags=apiserver_flags)
        )
        lab = FleetLab(cp, {n.name: n for n in nodes}, "", workdir)
        _apply_agent(cp, ds_args or [])
        made: list[str] = []
        stack.callback(lambda: [build.delete_netns(ns) for ns in made])
        for node in nodes:
            node.ns = f"ilt-{uuid.uuid4().hex[:8]}"
            build.create_netns(node.ns)
            made.append(node.ns)
            build.build(node.ns, node.spec)
            node.host_root = workdir / f"host-{node.name}"
            node.kp = stack.enter_context(
                start_fake_kube_proxy(node.ns, node.kube_proxy, workdir / f"kp-{node.name}.json")
            )
            stack.enter_context(serving(node.ns, "--min-interval", "1"))
            fwd = Forwarder(node.ns, 9437)
            stack.callback(fwd.close)
            node.port = fwd.port
            _register(cp, node)
        _start_prometheus(lab, history)

        def stop_prometheus() -> None:
            if lab.prometheus is not None and lab.prometheus.poll() is None:
                lab.prometheus.terminate()
                lab.prometheus.wait(30)

        stack.callback(stop_prometheus)
        kubelet = StandInKubelet(lab)
        stack.callback(kubelet.stop)
        yield lab
