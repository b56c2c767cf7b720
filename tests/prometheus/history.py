"""Prometheus with history: series written as OpenMetrics, turned into TSDB blocks by
`promtool tsdb create-blocks-from openmetrics` (Prometheus' own backfill), then the real
Prometheus (Debian's, as the Prometheus tier runs it) started on those blocks on a free port
of 127.0.0.1, with the shipped rules (every `for:` set to 0s, so alerts follow the data at
once). Nothing scrapes: every sample is the test's.

A node's history is a function of time giving its series' values (None: no sample then).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.control_plane import free_port
from tests.prometheus.fleet import PROMETHEUS, rules_file

PROMTOOL = PROMETHEUS.with_name("promtool")
JOB = "ipvs-leftovers"
# what the agent's target exports, as the history gives it
SERIES = (
    "up",
    "ipvs_leftovers_nftables_mode_confirmed",
    "ipvs_leftovers_stale",
    "ipvs_leftovers_iptables_mode_chains",
    "ipvs_leftovers_kube_ipvs0_present",
    "ipvs_leftovers_foreign_references",
    "ipvs_leftovers_source_up",
    "ipvs_leftovers_kube_proxy_healthy",
)
Sample = dict[str, float | None]  # series name -> value at one time (None or missing: none)


AGENT_NAMESPACE = "ipvs-leftovers"  # the base's (daemonset/kustomization.yaml)


def agent_pod(node: str) -> str:
    """The name of the agent's pod on `node`, as the DaemonSet `ipvs-leftovers` names it (its
    name, a dash, five characters), the same on every call for one node."""
    return f"ipvs-leftovers-{hashlib.sha1(node.encode()).hexdigest()[:5]}"


@dataclass
class NodeHistory:
    cluster: str
    node: str
    at: Callable[[float], Sample | None]  # None: the target did not exist then
    instance: str = ""  # default NODE.CLUSTER:9437; a live target's, to continue its series
    # the target labels a PodMonitor and daemonset/plain give: the pod's namespace and name
    namespace: str = AGENT_NAMESPACE
    pod: str = ""  # default agent_pod(node)


def steady(**values: float) -> Sample:
    """A healthy, confirmed nftables node with leftovers, changed by `values`."""
    base: Sample = {
        "up": 1,
        "ipvs_leftovers_nftables_mode_confirmed": 1,
        "ipvs_leftovers_stale": 1,
        "ipvs_leftovers_iptables_mode_chains": 0,
        "ipvs_leftovers_kube_ipvs0_present": 1,
        "ipvs_leftovers_foreign_references": 0,
        "ipvs_leftovers_source_up": 1,
        "ipvs_leftovers_kube_proxy_healthy": 1,
    }
    base.update(values)
    return base


def openmetrics(nodes: list[NodeHistory], start: float, end: float, step: float) -> str:
    times = [start + i * step for i in range(int((end - start) // step) + 1)]
    samples = [[(t, n.at(t)) for t in times] for n in nodes]
    lines = []
    for name in SERIES:
        lines.append(f"# TYPE {name} gauge")
        for i, n in enumerate(nodes):
            instance = n.instance or f"{n.node}.{n.cluster}:9437"
            labels = (
                f'job="{JOB}",cluster="{n.cluster}",node="{n.node}",instance="{instance}",'
                f'namespace="{n.namespace}",pod="{n.pod or agent_pod(n.node)}"'
            )
            for t, sample in samples[i]:
                value = None if sample is None else sample.get(name)
                if value is not None:
                    lines.append(f"{name}{{{labels}}} {value:g} {t:.3f}")
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def start_prometheus(
    config: Path, data: Path, log_path: Path, lifetime: float, ready_timeout: float = 60
) -> tuple[subprocess.Popen[bytes], str]:
    """Debian's Prometheus on a free port of 127.0.0.1, answering its API: (process, URL).

    A free port is only free until somebody binds it: when Prometheus finds its port taken it
    exits, and it is started again on another (three tries). Ready means this process is alive
    and the API answers, so another program on a reused port is never taken for it."""
    for attempt in range(3):
        port = free_port()
        with log_path.open("ab") as log:
            offset = log.tell()
            proc = subprocess.Popen(
                ["timeout", "-s", "TERM", f"{lifetime:g}", str(PROMETHEUS)]
                + [f"--config.file={config}", f"--storage.tsdb.path={data}"]
                + ["--storage.tsdb.retention.time=30d"]
                + [f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                stdout=log,
                stderr=log,
            )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + ready_timeout
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/api/v1/status/runtimeinfo", timeout=5):
                    pass
            except OSError:
                time.sleep(0.3)
                continue
            if proc.poll() is None:
                return proc, url
        said = log_path.read_bytes()[offset:].decode(errors="replace")
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"Prometheus not answering after {ready_timeout:g}s: {said[-3000:]}")
        if attempt == 2 or "address already in use" not in said:
            raise RuntimeError(f"Prometheus exited {proc.returncode}: {said[-3000:]}")
    raise AssertionError("unreachable")


@dataclass
class HistoryPrometheus:
    url: str
    proc: subprocess.Popen[bytes]
    workdir: Path

    def api(self, path: str) -> object:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=20) as r:
            return json.loads(r.read())["data"]

    def firing(self) -> set[tuple[str, str]]:
        alerts = self.api("/api/v1/alerts")["alerts"]  # type: ignore[index]
        return {
            (a["labels"]["alertname"], a["labels"].get("node", ""))
            for a in alerts
            if a["state"] == "firing"
        }

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def backfill(text: str | Path, workdir: Path, timeout: float = 600) -> Path:
    """`text` OpenMetrics, or a file holding it; the TSDB folder."""
    data = workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    if isinstance(text, Path):
        src = text
    else:
        src = workdir / "history.om"
        src.write_text(text)
    p = subprocess.run(
        [str(PROMTOOL), "tsdb", "create-blocks-from", "openmetrics", str(src), str(data)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return data


@contextmanager
def history_prometheus(
    text: str | Path,
    workdir: Path,
    rule_for: str = "0s",
    lifetime: float = 900,
    backfill_timeout: float = 600,
) -> Iterator[HistoryPrometheus]:
    workdir.mkdir(parents=True, exist_ok=True)
    data = backfill(text, workdir, backfill_timeout)
    rules = rules_file(workdir / "ipvs-leftovers.rules.yaml", rule_for)
    config = {"global": {"evaluation_interval": "1s"}, "rule_files": [str(rules)]}
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    proc, url = start_prometheus(
        workdir / "prometheus.yml", data, workdir / "prometheus.log", lifetime
    )
    prom = HistoryPrometheus(url, proc, workdir)
    try:
        yield prom
    finally:
        prom.stop()
