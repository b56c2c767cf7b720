"""A fleet of lab nodes scraped by a real Prometheus, all in throwaway namespaces.

Topology: one namespace per node (the lab's state, a fake kube-proxy on its loopback, `serve`
from the built image with the DaemonSet's own flags and args), and one `prom` namespace that
holds Prometheus. Each node is joined to `prom` by a veth pair made inside `prom` (never in this
machine's namespace), 10.250.<i>.1 (prom) - 10.250.<i>.2 (node). Prometheus is Debian's binary,
on 127.0.0.1 of `prom`, with a temp data dir, under `timeout` so it stops by itself, and the
shipped PrometheusRule's groups as its rules file with every `for:` shortened.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lab import build
from lab.kube_proxy import FakeKubeProxy, start_fake_kube_proxy
from lab.model import Node
from tests.conftest import REPO
from tests.image.containers import DAEMONSET, detached, pod_spec

PROMETHEUS = Path("/opt/prometheus/usr/bin/prometheus")  # scripts/install-deps puts it there
PROM_PORT = 9090
AGENT_PORT = 9437
JOB = "ipvs-leftovers"
# Every target also carries labels that Prometheus setups commonly attach, among them `owner`,
# which the agent's own series must not use (it would become exported_owner).
TARGET_LABELS = {"cluster": "lab", "owner": "team-network"}
# Every alert's `for:` in the test (the shipped values are minutes to hours): longer than one
# scrape interval, so that one slow scrape on a loaded CI machine (up 0 once) cannot fire
# IPVSLeftoversAgentDown.
RULE_FOR = "7s"
SCRAPE_INTERVAL, SCRAPE_TIMEOUT = 3.0, 2.5  # seconds
LIFETIME = 900  # seconds: Prometheus stops by itself after this, whatever happens to the test


@dataclass
class LabNode:
    name: str  # the `node` label
    spec: Node
    kube_proxy: dict[str, Any] | None  # fake kube-proxy state; None: kube-proxy down
    ns: str = ""
    kp: FakeKubeProxy | None = None


def rules_file(out: Path, rule_for: str = RULE_FOR) -> Path:
    """The PrometheusRule's groups as a Prometheus rules file, each `for:` set to rule_for."""
    doc = yaml.safe_load((REPO / "daemonset" / "prometheusrule.yaml").read_text())
    groups = doc["spec"]["groups"]
    for g in groups:
        for rule in g["rules"]:
            if "for" in rule:
                rule["for"] = rule_for
    out.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return out


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


# How a node runs `serve`: a context manager that returns once it listens on AGENT_PORT.
Server = Callable[[LabNode, Path], AbstractContextManager[Any]]


def in_image(image: str) -> Server:
    """serve from the built image, with the DaemonSet's own flags and args (this kernel)."""

    def start(node: LabNode, host_root: Path) -> AbstractContextManager[Any]:
        spec = pod_spec(DAEMONSET, host_root)
        return detached(image, node.ns, spec, *spec.args, port=AGENT_PORT)

    return start


@dataclass
class Fleet:
    prom_ns: str
    nodes: dict[str, LabNode]
    workdir: Path
    slow: float = 1.0  # scrape interval and timeout multiplier (the VM's emulation: 3)
    prometheus: subprocess.Popen[bytes] | None = None
    gone: list[str] = field(default_factory=list)  # node labels of targets nobody serves

    # --- the Prometheus API, from inside `prom` ----------------------------------------------
    def api(self, path: str, **params: str) -> Any:
        query = f"{path}?{urllib.parse.urlencode(params)}" if params else path
        script = str(REPO / "tests" / "prometheus" / "promapi.py")
        p = subprocess.run(
            ["ip", "netns", "exec", self.prom_ns, sys.executable, script, str(PROM_PORT), query],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if p.returncode != 0:
            raise RuntimeError(f"Prometheus API {query}: {p.stderr[-500:]}")
        doc = json.loads(p.stdout)
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        data = self.api("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", data
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def alerts(self, state: str = "firing") -> set[tuple[str, str]]:
        """(alertname, node) of every alert in `state`; node "" for a fleet-wide alert."""
        return {
            (a["labels"]["alertname"], a["labels"].get("node", ""))
            for a in self.api("/api/v1/alerts")["alerts"]
            if a["state"] == state
        }

    def wait_alerts(self, want: set[tuple[str, str]], timeout: float = 120) -> None:
        """Until exactly `want` fires; the failure shows what fired and what was pending."""
        seen: list[Any] = []

        def check() -> bool:
            seen[:] = [self.alerts(), self.alerts("pending")]
            return seen[0] == want

        try:
            self.wait_for("the expected alerts", check, timeout)
        except AssertionError:
            firing, pending = seen
            raise AssertionError(
                f"firing {sorted(firing)} (missing {sorted(want - firing)}, unexpected "
                f"{sorted(firing - want)}), pending {sorted(pending)}"
            ) from None

    def wait_for(self, what: str, check: Callable[[], Any], timeout: float = 120) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = check()
            if last:
                return last
            time.sleep(1)
        raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def _start_prometheus(fleet: Fleet, targets: list[tuple[str, str]]) -> None:
    work = fleet.workdir
    rules = rules_file(work / "ipvs-leftovers.rules.yaml")
    config = {
        "global": {
            "scrape_interval": f"{SCRAPE_INTERVAL * fleet.slow:g}s",
            "scrape_timeout": f"{SCRAPE_TIMEOUT * fleet.slow:g}s",
            "evaluation_interval": "1s",
        },
        "rule_files": [str(rules)],
        "scrape_configs": [
            {
                "job_name": JOB,
                "static_configs": [
                    {"targets": [addr], "labels": {"node": node, **TARGET_LABELS}}
                    for node, addr in targets
                ],
            }
        ],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    (work / "data").mkdir()
    log = (work / "prometheus.log").open("wb")
    fleet.prometheus = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            fleet.prom_ns,
            "timeout",
            "-s",
            "TERM",
            f"{LIFETIME * fleet.slow:g}",
        ]
        + [str(PROMETHEUS), f"--config.file={work / 'prometheus.yml'}"]
        + [f"--storage.tsdb.path={work / 'data'}", "--storage.tsdb.retention.time=1h"]
        + [f"--web.listen-address=127.0.0.1:{PROM_PORT}", "--log.level=warn"],
        stdout=log,
        stderr=log,
    )

    def ready() -> bool:
        if fleet.prometheus is not None and fleet.prometheus.poll() is not None:
            raise RuntimeError(f"Prometheus exited: {(work / 'prometheus.log').read_text()}")
        try:
            return bool(fleet.api("/api/v1/status/runtimeinfo"))
        except RuntimeError:
            return False

    fleet.wait_for("Prometheus to answer", ready, timeout=60 * fleet.slow**2)


@contextmanager
def fleet(
    server: Server, nodes: list[LabNode], workdir: Path, gone: list[str], slow: float = 1.0
) -> Iterator[Fleet]:
    prom = f"ilt-prom-{uuid.uuid4().hex[:6]}"
    made: list[str] = []
    f = Fleet(prom, {n.name: n for n in nodes}, workdir, gone=gone, slow=slow)
    with ExitStack() as stack:
        try:
            build.create_netns(prom)
            made.append(prom)
            targets = []
            for i, node in enumerate(nodes, start=1):
                node.ns = f"ilt-{uuid.uuid4().hex[:8]}"
                build.create_netns(node.ns)
                made.append(node.ns)
                build.build(node.ns, node.spec)
                _ip("-n", prom, "link", "add", f"p{i}", "type", "veth", "peer", "name", "prom0",
                    "netns", node.ns)  # fmt: skip
                _ip("-n", prom, "addr", "add", f"10.250.{i}.1/24", "dev", f"p{i}")
                _ip("-n", prom, "link", "set", f"p{i}", "up")
                _ip("-n", node.ns, "addr", "add", f"10.250.{i}.2/24", "dev", "prom0")
                _ip("-n", node.ns, "link", "set", "prom0", "up")
                if node.kube_proxy is not None:
                    node.kp = stack.enter_context(
                        start_fake_kube_proxy(
                            node.ns,
                            node.kube_proxy,
                            workdir / f"kp-{node.name}.json",
                        )
                    )
                stack.enter_context(server(node, workdir / f"host-{node.name}"))
                targets.append((node.name, f"10.250.{i}.2:{AGENT_PORT}"))
            # a node whose agent is gone: nothing listens there
            targets += [(name, f"127.0.0.1:{9 + k}") for k, name in enumerate(gone)]
            _start_prometheus(f, targets)
            yield f
        finally:
            if f.prometheus is not None:
                f.prometheus.terminate()
                try:
                    f.prometheus.wait(30)
                except subprocess.TimeoutExpired:
                    f.prometheus.kill()
                    f.prometheus.wait()
            stack.close()
            for ns in made:
                build.delete_netns(ns)


def panel_queries(
    cluster: str = ".*", node: str = ".*", rate_interval: str = "1m"
) -> dict[tuple[str, str], str]:
    """Every dashboard query with Grafana's variables filled in, by (panel title, refId)."""
    dash = json.loads((REPO / "daemonset" / "dashboard.json").read_text())
    out = {}
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            expr = t["expr"].replace("$__rate_interval", rate_interval)
            expr = re.sub(r"\$\{?cluster\}?", cluster, expr)
            expr = re.sub(r"\$\{?node\}?", node, expr)
            key = (panel["title"], t["refId"])
            assert key not in out, f"two dashboard panels are titled {panel['title']!r}"
            out[key] = expr
    return out
