"""Checks of daemonset/ that need Python; scripts/check-manifests runs them and the tools.

    check_manifests.py schemas RENDERED K8S_VERSION...  core kinds against Kubernetes schemas
    check_manifests.py crds RENDERED TESTS REPO          PodMonitor, PrometheusRule, DaemonSet rules
    check_manifests.py overlay RENDERED BASE_URL CLEANUP_JOB  tests/manifests/overlay rendered
    check_manifests.py extract-rules RENDERED OUT        the PrometheusRule's spec as a rules file
    check_manifests.py dashboard DASHBOARD OUT           dashboard JSON; its PromQL as a rules file

Each prints one line per problem and exits 1 when there is any.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

# docs/contract.md#metrics: every series the manifests may query.
AGENT_METRICS = {
    "ipvs_leftovers_stale",
    "ipvs_leftovers_kube_ipvs0_present",
    "ipvs_leftovers_kube_ipvs0_addresses",
    "ipvs_leftovers_ipvs_virtual_servers",
    "ipvs_leftovers_ipvs_real_servers",
    "ipvs_leftovers_ipsets",
    "ipvs_leftovers_ipset_entries",
    "ipvs_leftovers_iptables_chains",
    "ipvs_leftovers_iptables_rules",
    "ipvs_leftovers_iptables_mode_chains",
    "ipvs_leftovers_kube_proxy_mode_info",
    "ipvs_leftovers_nftables_mode_confirmed",
    "ipvs_leftovers_nftables_kernel_ready",
    "ipvs_leftovers_source_up",
    "ipvs_leftovers_subsystem_loaded",
    "ipvs_leftovers_scrape_duration_seconds",
    "ipvs_leftovers_build_info",
    # kube-proxy's own state, re-exported: its :10249 is on the node's loopback
    "ipvs_leftovers_kube_proxy_healthy",
    "ipvs_leftovers_kube_proxy_last_sync_timestamp_seconds",
    "ipvs_leftovers_kube_proxy_nftables_sync_failures_total",
    "ipvs_leftovers_unknown_kube_objects",
    # serve --auto-cleanup's runs
    "ipvs_leftovers_cleanup_runs_total",
    "ipvs_leftovers_nftables_confirmed_streak_seconds",
}
OTHER_METRICS = {"up"}
# Nothing may query kube-proxy's own kubeproxy_* series: Prometheus usually cannot scrape them.
OTHER_PREFIXES: tuple[str, ...] = ()
JOB = "ipvs-leftovers"  # the PodMonitor's jobLabel value: the alerts select job="ipvs-leftovers"

PROMQL_KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "offset", "bool", "inf", "nan", "atan2",
}  # fmt: skip
SEVERITIES = {"critical", "warning", "info"}
_VERSION = re.search(
    r'__version__ = "([^"]+)"',
    (Path(__file__).resolve().parents[2] / "agent" / "__init__.py").read_text(),
)
# The chart's default: the runbooks of the version installed (the chart's appVersion).
RUNBOOK_BASE = (
    f"https://github.com/example/ipvs-leftovers/blob/v{_VERSION.group(1) if _VERSION else '?'}"
    "/docs/runbooks/"
)
CRD_KINDS = {"PodMonitor", "PrometheusRule"}


class Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, what: str) -> None:
        self.items.append(f"{where}: {what}")

    def exit(self) -> None:
        for item in self.items:
            print(f"  FAIL {item}")
        sys.exit(1 if self.items else 0)


def load_docs(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def name_of(obj: dict[str, Any]) -> str:
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


# --- PromQL -------------------------------------------------------------------------------------

_NAME_MATCHER = re.compile(r'__name__\s*=\s*"([^"]*)"')
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_GRAFANA_VAR = re.compile(r"\$\{[^}]*\}|\$\w+")
_IDENT = re.compile(r"(?<![\w$.:])([A-Za-z_:][\w:]*)\s*(\()?")


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects: identifiers that are neither functions, keywords,
    label names inside grouping clauses or matchers, nor numbers and durations."""
    names = set(_NAME_MATCHER.findall(expr))
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _GROUPING.sub(" ", text)
    text = _GRAFANA_VAR.sub("", text)
    for m in _IDENT.finditer(text):
        ident, call = m.group(1), m.group(2)
        if call or ident.lower() in PROMQL_KEYWORDS:
            continue
        names.add(ident)
    return names


def unknown_metrics(expr: str) -> list[str]:
    return sorted(
        n
        for n in metric_names(expr)
        if n not in AGENT_METRICS and n not in OTHER_METRICS and not n.startswith(OTHER_PREFIXES)
    )


def grafana_to_promql(expr: str) -> str:
    """Grafana's interval variables as durations, so that promtool can parse the expression."""
    return re.sub(r"\$\{?__(rate_interval|interval|range)\}?", "5m", expr)


# --- schemas ------------------------------------------------------------------------------------


def cmd_schemas(rendered: str, versions: Iterable[str]) -> None:
    import kubernetes_validate

    problems = Problems()
    docs = load_docs(rendered)
    core = [d for d in docs if d.get("kind") not in CRD_KINDS]
    for version in versions:
        for obj in core:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = "/".join(str(p) for p in exc.path)
                problems.add(f"{name_of(obj)} (k8s {version})", f"{path}: {exc.message}")
            except Exception as exc:  # SchemaNotFoundError, InvalidSchemaError, ...
                problems.add(f"{name_of(obj)} (k8s {version})", f"{type(exc).__name__}: {exc}")
    kinds = ", ".join(sorted({str(d.get("kind")) for d in core}))
    print(f"  {len(core)} objects ({kinds}) against Kubernetes {', '.join(versions)} (strict)")
    problems.exit()


# --- CRDs and the DaemonSet's own rules ---------------------------------------------------------


def _one(docs: list[dict[str, Any]], kind: str, problems: Problems) -> dict[str, Any]:
    found = [d for d in docs if d.get("kind") == kind]
    if len(found) != 1:
        problems.add(kind, f"expected exactly one, found {len(found)}")
        return {}
    return found[0]


def _keys(obj: Any, allowed: set[str], where: str, problems: Problems) -> None:
    if not isinstance(obj, dict):
        problems.add(where, f"expected a mapping, got {type(obj).__name__}")
        return
    for key in set(obj) - allowed:
        problems.add(where, f"unknown field {key!r}")


def check_daemonset(ds: dict[str, Any], problems: Problems) -> dict[str, Any]:
    """The properties the issue asks for, so that an edit cannot lose one silently."""
    w = "DaemonSet"
    spec = ds.get("spec", {})
    pod = spec.get("template", {}).get("spec", {})
    want = {
        "hostNetwork": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
        "priorityClassName": "system-node-critical",
        "automountServiceAccountToken": False,
    }
    for key, value in want.items():
        if pod.get(key) != value:
            problems.add(w, f"pod {key} is {pod.get(key)!r}, want {value!r}")
    if pod.get("nodeSelector") != {"kubernetes.io/os": "linux"}:
        problems.add(w, "nodeSelector must be kubernetes.io/os: linux")
    if {"operator": "Exists"} not in pod.get("tolerations", []):
        problems.add(w, "needs the toleration {operator: Exists} (every node)")
    if spec.get("updateStrategy", {}).get("type") != "RollingUpdate":
        problems.add(w, "updateStrategy must be RollingUpdate")
    containers = {c.get("name"): c for c in pod.get("containers", [])}
    c = containers.get("ipvs-leftovers")
    if not c:
        problems.add(w, "no container named ipvs-leftovers")
        return {}
    if c.get("args", [])[:1] != ["serve"]:
        problems.add(w, f"args {c.get('args')!r} must start with serve")
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
    if ports.get("metrics") != 9437:
        problems.add(w, "needs the container port metrics: 9437")
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = c.get(probe, {}).get("httpGet", {})
        if get.get("path") != "/healthz" or get.get("port") not in ("metrics", 9437):
            problems.add(w, f"{probe} must be httpGet /healthz on the metrics port")
    sc = c.get("securityContext", {})
    if sc.get("readOnlyRootFilesystem") is not True:
        problems.add(w, "readOnlyRootFilesystem must be true")
    if sc.get("allowPrivilegeEscalation") is not False:
        problems.add(w, "allowPrivilegeEscalation must be false")
    if sc.get("privileged"):
        problems.add(w, "must not be privileged")
    caps = sc.get("capabilities", {})
    if caps.get("drop") != ["ALL"]:
        problems.add(w, "capabilities must drop ALL")
    if "NET_ADMIN" not in caps.get("add", []):
        problems.add(w, "capabilities must add NET_ADMIN")
    extra = set(caps.get("add", [])) - {"NET_ADMIN", "NET_RAW"}
    if extra:
        problems.add(w, f"capabilities beyond NET_ADMIN/NET_RAW: {sorted(extra)}")
    res = c.get("resources", {})
    if not res.get("requests") or not res.get("limits", {}).get("memory"):
        problems.add(w, "needs resource requests and a memory limit")
    mounts = {m.get("mountPath"): m.get("name") for m in c.get("volumeMounts", [])}
    volumes = {v.get("name"): v for v in pod.get("volumes", [])}
    lock = volumes.get(mounts.get("/run/xtables.lock", ""), {}).get("hostPath", {})
    if lock != {"path": "/run/xtables.lock", "type": "FileOrCreate"}:
        problems.add(w, "/run/xtables.lock must be the host's (hostPath, FileOrCreate)")
    if "emptyDir" not in volumes.get(mounts.get("/tmp", ""), {}):
        problems.add(w, "/tmp must be an emptyDir (the root filesystem is read-only)")
    return dict(spec.get("template", {}).get("metadata", {}).get("labels", {}))


def check_podmonitor(pm: dict[str, Any], pod_labels: dict[str, Any], problems: Problems) -> None:
    w = "PodMonitor"
    if pm.get("apiVersion") != "monitoring.coreos.com/v1":
        problems.add(w, "apiVersion must be monitoring.coreos.com/v1")
    spec = pm.get("spec", {})
    _keys(
        spec,
        {"selector", "namespaceSelector", "podMetricsEndpoints", "jobLabel", "podTargetLabels",
         "sampleLimit", "targetLimit", "attachMetadata"},
        f"{w}.spec",
        problems,
    )  # fmt: skip
    job_label = spec.get("jobLabel")
    if job_label is None or pod_labels.get(job_label) != JOB:
        problems.add(w, f"jobLabel must name a pod label whose value is {JOB!r} (the job)")
    selector = spec.get("selector", {}).get("matchLabels", {})
    if not selector or any(pod_labels.get(k) != v for k, v in selector.items()):
        problems.add(w, f"selector {selector} does not select the DaemonSet's pods {pod_labels}")
    endpoints = spec.get("podMetricsEndpoints", [])
    if len(endpoints) != 1:
        problems.add(w, "expected one podMetricsEndpoint")
        return
    ep = endpoints[0]
    _keys(
        ep,
        {"port", "path", "interval", "scrapeTimeout", "relabelings", "metricRelabelings",
         "scheme", "honorLabels", "honorTimestamps"},
        f"{w}.podMetricsEndpoints[0]",
        problems,
    )  # fmt: skip
    if ep.get("port") != "metrics":
        problems.add(w, "must scrape the port named metrics")
    if ep.get("interval") != "30s":
        problems.add(w, "interval must be 30s")
    node = [
        r
        for r in ep.get("relabelings", [])
        if r.get("targetLabel") == "node"
        and r.get("sourceLabels") == ["__meta_kubernetes_pod_node_name"]
        and r.get("action", "replace") == "replace"
    ]
    if not node:
        problems.add(w, "needs a relabeling node <- __meta_kubernetes_pod_node_name")


def check_rules(
    pr: dict[str, Any],
    tests_path: str | None,
    repo: Path,
    problems: Problems,
    runbook_base: str = RUNBOOK_BASE,
) -> None:
    w = "PrometheusRule"
    if pr.get("apiVersion") != "monitoring.coreos.com/v1":
        problems.add(w, "apiVersion must be monitoring.coreos.com/v1")
    groups = pr.get("spec", {}).get("groups", [])
    _keys(pr.get("spec", {}), {"groups"}, f"{w}.spec", problems)
    alerts: list[str] = []
    for g in groups:
        _keys(g, {"name", "interval", "rules", "partial_response_strategy", "limit"}, w, problems)
        for rule in g.get("rules", []):
            name = rule.get("alert") or rule.get("record") or "?"
            where = f"{w} {name}"
            allowed = {"alert", "record", "expr", "for", "labels", "annotations"}
            _keys(rule, allowed, where, problems)
            bad = unknown_metrics(str(rule.get("expr", "")))
            if bad:
                problems.add(where, f"expr uses metrics that do not exist: {bad}")
            if "alert" not in rule:
                continue
            alerts.append(name)
            if not rule.get("for"):
                problems.add(where, "needs for:")
            if rule.get("labels", {}).get("severity") not in SEVERITIES:
                problems.add(where, f"severity must be one of {sorted(SEVERITIES)}")
            ann = rule.get("annotations", {})
            for key in ("summary", "description", "runbook_url"):
                if not ann.get(key):
                    problems.add(where, f"needs annotation {key}")
            if ann.get("runbook_url") != f"{runbook_base}{name}.md":
                problems.add(where, f"runbook_url must be {runbook_base}{name}.md")
            expr = str(rule.get("expr", ""))
            for job in re.findall(r"\bjob\s*(=~|!=|!~|=)\s*\"([^\"]*)\"", expr):
                if job != ("=", JOB):
                    problems.add(where, f'selects job{job[0]}"{job[1]}": want exactly job="{JOB}"')
            if not (repo / "docs" / "runbooks" / f"{name}.md").is_file():
                problems.add(where, f"docs/runbooks/{name}.md is missing")
    if len(set(alerts)) != len(alerts):
        problems.add(w, "alert names are not unique")
    if tests_path is None:
        return
    with open(tests_path) as f:
        tests = yaml.safe_load(f) or {}
    firing: set[str] = set()
    quiet: set[str] = set()
    for test in tests.get("tests", []):
        for case in test.get("alert_rule_test", []):
            (firing if case.get("exp_alerts") else quiet).add(case.get("alertname"))
    for name in alerts:
        if name not in firing:
            problems.add(f"{tests_path}", f"no firing case for {name}")
        if name not in quiet:
            problems.add(f"{tests_path}", f"no not-firing case for {name}")
    print(f"  {len(alerts)} alerts, each with a runbook and a firing and a not-firing test")


def check_dashboard_configmap(docs: list[dict[str, Any]], problems: Problems) -> None:
    cms = [
        d
        for d in docs
        if d.get("kind") == "ConfigMap" and "dashboard.json" in (d.get("data") or {})
    ]
    if len(cms) != 1:
        problems.add("ConfigMap", "expected one ConfigMap holding dashboard.json")
        return
    if cms[0].get("metadata", {}).get("labels", {}).get("grafana_dashboard") != "1":
        problems.add(name_of(cms[0]), 'needs the label grafana_dashboard: "1"')


def check_priority_quota(docs: list[dict[str, Any]], problems: Problems) -> None:
    """system-*-critical pods outside kube-system need a ResourceQuota covering their class."""
    pods = [
        d["spec"]["template"]["spec"]
        for d in docs
        if d.get("kind") in ("DaemonSet", "Job") and "template" in d.get("spec", {})
    ]
    quotas = [d for d in docs if d.get("kind") == "ResourceQuota"]
    for pod in pods:
        pc = pod.get("priorityClassName", "")
        if not pc.startswith("system-"):
            continue
        covered = any(
            e.get("scopeName") == "PriorityClass"
            and e.get("operator") == "In"
            and pc in e.get("values", [])
            for q in quotas
            for e in q.get("spec", {}).get("scopeSelector", {}).get("matchExpressions", [])
        )
        if not covered:
            problems.add("ResourceQuota", f"none covers priorityClassName {pc} in this namespace")


def check_namespaces(docs: list[dict[str, Any]], want: str, problems: Problems) -> None:
    """Every object in `want`; no Namespace object (daemonset/setup has it); nothing that
    selects the base's namespace by name."""
    for d in docs:
        ns = d.get("metadata", {}).get("namespace")
        if d.get("kind") == "Namespace":
            problems.add(name_of(d), "must not be here: the Namespace is in daemonset/setup")
        elif ns != want:
            problems.add(name_of(d), f"namespace is {ns!r}, want {want}")
        if "namespaceSelector" in d.get("spec", {}):
            problems.add(name_of(d), "selects namespaces by name (namespaceSelector)")
    check_priority_quota(docs, problems)


def cmd_crds(rendered: str, tests_path: str, repo: str) -> None:
    problems = Problems()
    docs = load_docs(rendered)
    check_namespaces(docs, "ipvs-leftovers", problems)
    sa = _one(docs, "ServiceAccount", problems)
    if sa and sa.get("automountServiceAccountToken") is not False:
        problems.add("ServiceAccount", "automountServiceAccountToken must be false")
    pod_labels = check_daemonset(_one(docs, "DaemonSet", problems), problems)
    check_podmonitor(_one(docs, "PodMonitor", problems), pod_labels, problems)
    check_rules(_one(docs, "PrometheusRule", problems), tests_path, Path(repo), problems)
    check_dashboard_configmap(docs, problems)
    check_alert_panels(_one(docs, "PrometheusRule", problems), docs, problems)
    problems.exit()


def check_alert_panels(pr: dict[str, Any], docs: list[dict[str, Any]], problems: Problems) -> None:
    """Every alert has a dashboard panel whose description names it ("Alert: NAME")."""
    cms = [
        d for d in docs if d.get("kind") == "ConfigMap" and "dashboard.json" in d.get("data", {})
    ]
    if not cms:
        return
    dash = json.loads(cms[0]["data"]["dashboard.json"])
    named = {
        name
        for panel in _panels(dash.get("panels", []))
        for name in re.findall(r"Alert: (\w+)", str(panel.get("description", "")))
    }
    alerts = {
        r["alert"]
        for g in pr.get("spec", {}).get("groups", [])
        for r in g.get("rules", [])
        if "alert" in r
    }
    for name in sorted(alerts - named):
        problems.add(
            "dashboard", f'no panel names alert {name} ("Alert: {name}" in its description)'
        )
    for name in sorted(named - alerts):
        problems.add("dashboard", f"a panel names {name}, which is no alert")
    print(f"  {len(alerts)} alerts, each named by a dashboard panel")


def cmd_overlay(rendered: str, base_url: str, cleanup_job: str) -> None:
    """An operator's overlay (tests/manifests/overlay): own namespace, runbook URL, auto-cleanup."""
    problems = Problems()
    docs = load_docs(rendered)
    check_namespaces(docs, "monitoring", problems)
    rules = _one(docs, "PrometheusRule", problems)
    check_rules(rules, None, Path("."), problems, base_url.rstrip("/") + "/")
    ds = _one(docs, "DaemonSet", problems)
    pod = ds.get("spec", {}).get("template", {}).get("spec", {})
    container = (pod.get("containers") or [{}])[0]
    args = container.get("args", [])
    job = load_docs(cleanup_job)[0]["spec"]["template"]["spec"]
    job_args = job["containers"][0]["args"]
    want = {
        "--auto-cleanup",
        f"--backup-dir={job_args[job_args.index('--backup-dir') + 1]}",
        f"--lock-file={job_args[job_args.index('--lock-file') + 1]}",
    }
    if args[:1] != ["serve"] or not want <= set(args):
        problems.add("DaemonSet", f"args {args} lack {sorted(want - set(args))}")

    def host_paths(spec: dict[str, Any]) -> dict[str, Any]:
        vols = {v["name"]: v.get("hostPath") for v in spec.get("volumes", [])}
        mounts = spec["containers"][0].get("volumeMounts", [])
        return {m["mountPath"]: vols.get(m["name"]) for m in mounts if vols.get(m["name"])}

    ds_paths, job_paths = host_paths(pod), host_paths(job)
    for path, host in job_paths.items():
        if ds_paths.get(path) != host:
            problems.add("DaemonSet", f"mounts {ds_paths.get(path)} at {path}, the Job {host}")
    if (
        container.get("resources", {}).get("limits", {}).get("memory")
        != job["containers"][0]["resources"]["limits"]["memory"]
    ):
        problems.add("DaemonSet", "auto-cleanup needs the cleanup Job's memory limit")
    for kind in sorted(CRD_KINDS):
        labels = _one(docs, kind, problems).get("metadata", {}).get("labels", {})
        if labels.get("release") != "kube-prometheus-stack":
            problems.add(kind, f"no release label from components/prometheus-release: {labels}")
    if any(d.get("kind") == "ConfigMap" and "release" in (d.get("data") or {}) for d in docs):
        problems.add("ConfigMap", "the release ConfigMap is local-config: it must not render")
    print(
        f"  {len(docs)} objects in monitoring; runbooks under {base_url}; auto-cleanup mounts; "
        "release label on the PodMonitor and PrometheusRule"
    )
    problems.exit()


def cmd_extract_rules(rendered: str, out: str) -> None:
    problems = Problems()
    pr = _one(load_docs(rendered), "PrometheusRule", problems)
    if pr:
        with open(out, "w") as f:
            yaml.safe_dump(pr.get("spec", {}), f, sort_keys=False)
    problems.exit()


# --- dashboard ----------------------------------------------------------------------------------


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels", []))  # collapsed rows


def cmd_dashboard(path: str, out: str) -> None:
    problems = Problems()
    try:
        with open(path) as f:
            dash = json.load(f)
    except (OSError, ValueError) as exc:
        problems.add(path, f"not JSON: {exc}")
        problems.exit()
    for key in ("uid", "title", "panels", "schemaVersion"):
        if key not in dash:
            problems.add(path, f"missing {key}")
    variables = {v.get("name") for v in dash.get("templating", {}).get("list", [])}
    for var in ("datasource", "cluster", "node"):
        if var not in variables:
            problems.add(path, f"no dashboard variable {var!r}")
    rules = []
    ids = set()
    for panel in _panels(dash.get("panels", [])):
        title = panel.get("title", "?")
        if panel.get("type") == "row":
            continue
        if panel.get("id") in ids:
            problems.add(title, f"duplicate panel id {panel.get('id')}")
        ids.add(panel.get("id"))
        targets = panel.get("targets", [])
        if not targets:
            problems.add(title, "panel has no targets")
        for t in targets:
            expr = t.get("expr", "")
            if not expr:
                problems.add(title, f"target {t.get('refId')} has no expr")
                continue
            bad = unknown_metrics(expr)
            if bad:
                problems.add(title, f"{t.get('refId')} uses metrics that do not exist: {bad}")
            for sel in re.finditer(r"ipvs_leftovers_\w+(\{[^}]*\})?", expr):
                if 'cluster=~"$cluster"' not in (sel.group(1) or "") or (
                    'node=~"$node"' not in (sel.group(1) or "")
                ):
                    problems.add(title, f"{sel.group(0)} ignores the cluster/node variables")
            rule_name = f"dashboard:panel{panel.get('id')}:{t.get('refId')}"
            rules.append({"record": rule_name, "expr": grafana_to_promql(expr)})
    with open(out, "w") as f:
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, f, sort_keys=False)
    print(f"  {len(ids)} panels, {len(rules)} queries, metric names all known")
    problems.exit()


def cmd_image_tools(dockerfile: str, repo: str) -> None:
    """Every command-line tool the agent runs is installed in the image (by its package)."""
    problems = Problems()
    sys.path.insert(0, repo)
    from agent.readers.tools import PACKAGES

    used: set[str] = set()
    for src in sorted(Path(repo, "agent").rglob("*.py")):
        used |= set(re.findall(r'tools\.run\(\s*\[\s*"([A-Za-z0-9_.-]+)"', src.read_text()))
    used |= set(PACKAGES)  # tools named through variables (iptables-*-save/-restore)
    text = Path(dockerfile).read_text().replace("\\\n", " ")
    installs = re.findall(r"apt-get install ([^&\n]+)", text)
    packages = {w.split("=", 1)[0] for line in installs for w in line.split() if w[0] != "-"}
    for tool in sorted(used):
        package = PACKAGES.get(tool.split("-", 1)[0])
        if package is None:
            problems.add(
                "agent", f"runs {tool}, which agent/readers/tools.py PACKAGES does not name"
            )
        elif package not in packages:
            problems.add("Dockerfile", f"does not install {package} (the agent runs {tool})")
    print(f"  the image installs {', '.join(sorted(packages))}; the agent runs {len(used)} tools")
    problems.exit()


def cmd_plain(base: str, rendered: str, out: str) -> None:
    """daemonset/plain: the rules file is the PrometheusRule's groups, the scrape job selects
    what the PodMonitor selects and gives the same job and node labels; `out` is a
    prometheus.yml holding both, for promtool check config."""
    problems = Problems()
    plain = Path(base) / "plain"
    rules = load_docs(str(plain / "ipvs-leftovers.rules.yaml"))[0]
    spec = _one(load_docs(rendered), "PrometheusRule", problems).get("spec", {})
    if rules != spec:
        problems.add(
            "plain/ipvs-leftovers.rules.yaml",
            "differs from prometheusrule.yaml (run: scripts/render-manifests)",
        )
    scrape = load_docs(str(plain / "scrape-config.yaml"))[0]
    (job,) = scrape["scrape_configs"]
    if job.get("job_name") != JOB:
        problems.add("plain/scrape-config.yaml", f"job_name must be {JOB} (the alerts select it)")
    pm = _one(load_docs(rendered), "PodMonitor", problems)
    # the PodMonitor's selector without the release (app.kubernetes.io/instance): one plain job
    # scrapes the agents of every release, as job="ipvs-leftovers" as the alerts select
    want = {
        f"{k}={v}"
        for k, v in pm["spec"]["selector"]["matchLabels"].items()
        if k != "app.kubernetes.io/instance"
    }
    sd = job.get("kubernetes_sd_configs", [{}])[0]
    if [set(str(x.get("label")).split(",")) for x in sd.get("selectors", [])] != [want]:
        problems.add("plain/scrape-config.yaml", f"must select the pods by {want}")
    endpoint = pm["spec"]["podMetricsEndpoints"][0]
    for key in ("interval", "scrapeTimeout"):
        mine = job.get({"interval": "scrape_interval", "scrapeTimeout": "scrape_timeout"}[key])
        if mine != endpoint[key]:
            problems.add(
                "plain/scrape-config.yaml", f"{key} {mine}, the PodMonitor's {endpoint[key]}"
            )
    if not any(r.get("target_label") == "node" for r in job.get("relabel_configs", [])):
        problems.add("plain/scrape-config.yaml", "no node label")
    allowed_sd = {"role", "namespaces", "selectors"}
    if sd.get("role") != "pod" or set(sd) - allowed_sd:
        problems.add(
            "plain/scrape-config.yaml", f"kubernetes_sd_configs: role pod, only {allowed_sd}"
        )
    # Debian's promtool (2.42+ds) is built without Kubernetes service discovery and refuses
    # kubernetes_sd_configs; the rest of the job (relabelling, intervals) and the rules file
    # are checked by promtool with one static target standing in for the discovered pods.
    checked = {**job, "static_configs": [{"targets": ["10.0.0.1:9437"]}]}
    del checked["kubernetes_sd_configs"]
    with open(out, "w") as f:
        rule_file = str((plain / "ipvs-leftovers.rules.yaml").resolve())
        yaml.safe_dump({"scrape_configs": [checked], "rule_files": [rule_file]}, f, sort_keys=False)
    print(
        f"  {sum(len(g.get('rules', [])) for g in spec.get('groups', []))} rules as the "
        f"PrometheusRule; job {JOB}"
    )
    problems.exit()


def _differences(a: Any, b: Any, path: str = "") -> Iterator[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            where = f"{path}.{key}"
            if key not in a:
                yield f"{where}: only in helm ({b[key]!r:.80})"
            elif key not in b:
                yield f"{where}: only in kustomize ({a[key]!r:.80})"
            else:
                yield from _differences(a[key], b[key], where)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _differences(x, y, f"{path}[{i}]")
    elif a != b:
        yield f"{path}: kustomize {a!r:.80}, helm {b!r:.80}"


def _label_maps(obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    labels = obj.get("metadata", {}).get("labels")
    if isinstance(labels, dict):
        yield labels


def cmd_helm_compare(kustomized: str, helmed: str, chart: str, repo: str) -> None:
    """`helm template` and `kubectl kustomize` of the same choices give the same objects."""
    problems = Problems()

    def by_key(path: str) -> dict[tuple[str, str, str], dict[str, Any]]:
        out = {}
        for d in load_docs(path):
            meta = d.get("metadata", {})
            out[(d.get("kind", ""), meta.get("namespace", ""), meta.get("name", ""))] = d
        return out

    k, h = by_key(kustomized), by_key(helmed)
    for obj in h.values():  # what only Helm writes (scripts/render-manifests drops them too)
        for labels in _label_maps(obj):
            labels.pop("helm.sh/chart", None)
            labels.pop("app.kubernetes.io/managed-by", None)
    for key in sorted(set(k) | set(h)):
        if key not in h:
            problems.add("/".join(key), "rendered by kustomize only")
        elif key not in k:
            problems.add("/".join(key), "rendered by helm only")
        else:
            for diff in _differences(k[key], h[key]):
                problems.add("/".join(key), diff)
    sys.path.insert(0, repo)
    from agent import __version__

    meta = load_docs(str(Path(chart) / "Chart.yaml"))[0]
    if meta.get("appVersion") != __version__:
        problems.add("Chart.yaml", f"appVersion must be the agent's {__version__}")
    print(f"  {len(k)} kustomize objects, {len(h)} helm objects compared")
    problems.exit()


def main(argv: list[str]) -> None:
    commands = {
        "image-tools": lambda a: cmd_image_tools(a[0], a[1]),
        "schemas": lambda a: cmd_schemas(a[0], a[1:]),
        "crds": lambda a: cmd_crds(a[0], a[1], a[2]),
        "overlay": lambda a: cmd_overlay(a[0], a[1], a[2]),
        "extract-rules": lambda a: cmd_extract_rules(a[0], a[1]),
        "dashboard": lambda a: cmd_dashboard(a[0], a[1]),
        "plain": lambda a: cmd_plain(a[0], a[1], a[2]),
        "helm-compare": lambda a: cmd_helm_compare(a[0], a[1], a[2], a[3]),
    }
    if len(argv) < 2 or argv[0] not in commands:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    commands[argv[0]](argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
