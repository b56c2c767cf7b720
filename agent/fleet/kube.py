"""The Kubernetes API, through the official client (an optional extra: `[fleet]`).

The official client is used for what it does that a small one would have to re-do: kubeconfig
with every auth provider (cloud `exec` plugins, OIDC, client certificates), in-cluster
service-account tokens that rotate. It is imported inside the functions, never at module level,
so that importing this module costs nothing and the node agent never loads it.

Every failure becomes `KubeError` with one line an operator reads: what was asked, and why it
failed (status and reason from the API server, or the connection error).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

AGENT_SELECTOR = "app.kubernetes.io/name=ipvs-leftovers,app.kubernetes.io/component=agent"
CONTAINER = "ipvs-leftovers"
REQUEST_TIMEOUT = 15.0  # seconds, each API call


class KubeError(Exception):
    """One line: what failed and why. `status` is the HTTP status when the API answered."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ClientMissing(KubeError):
    pass


def _modules() -> Any:
    try:
        import kubernetes
    except ImportError:
        raise ClientMissing(
            "the Kubernetes client is not installed (pip install 'ipvs-leftovers[fleet]')"
        ) from None
    return kubernetes


def api_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """An ApiClient from `kubeconfig` (or $KUBECONFIG, ~/.kube/config), or in-cluster when
    no kubeconfig is given and the pod's service account is there."""
    k = _modules()
    from kubernetes.config.config_exception import ConfigException

    cfg = k.client.Configuration()
    try:
        if kubeconfig is None and context is None:
            try:
                k.config.load_incluster_config(client_configuration=cfg)
            except ConfigException:
                k.config.load_kube_config(client_configuration=cfg)
        else:
            k.config.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=cfg
            )
    except (ConfigException, OSError, TypeError, ValueError) as exc:
        raise KubeError(f"no usable kubeconfig or in-cluster configuration: {exc}") from None
    cfg.retries = 0  # one answer or one error: the callers decide what to do next
    return k.client.ApiClient(cfg)


def describe(exc: BaseException, what: str) -> KubeError:
    """The one line for an exception of the client (ApiException, urllib3's errors)."""
    status = getattr(exc, "status", None)
    if isinstance(status, int) and status:
        reason = getattr(exc, "reason", "") or ""
        message = ""
        body = getattr(exc, "body", None)
        if body:
            import json

            try:
                message = json.loads(body).get("message", "")
            except (ValueError, AttributeError):
                message = ""
        detail = f": {message}" if message else ""
        return KubeError(f"{what}: HTTP {status} {reason}{detail}".rstrip(), status)
    text = str(getattr(exc, "reason", None) or exc).splitlines()[0] if str(exc) else repr(exc)
    return KubeError(f"{what}: cannot reach the API server ({text})")


def call(what: str, fn: Any, *args: Any, **kw: Any) -> Any:
    """fn(*args, **kw) with the request timeout; any client failure as KubeError."""
    try:
        return fn(*args, _request_timeout=REQUEST_TIMEOUT, **kw)
    except KubeError:
        raise
    except Exception as exc:  # noqa: BLE001 - ApiException, urllib3 and socket errors alike
        raise describe(exc, what) from None


@dataclass(frozen=True)
class AgentDaemonSet:
    namespace: str
    name: str
    image: str
    args: tuple[str, ...]
    # its pods' ServiceAccount: the cleanup Jobs run as it (a chart release names it after
    # itself, so it is not always "ipvs-leftovers")
    service_account: str = "ipvs-leftovers"

    @property
    def auto_cleanup(self) -> bool:
        return "--auto-cleanup" in self.args


def agent_daemonset(api: Any, namespace: str | None = None) -> AgentDaemonSet:
    """The running agent's DaemonSet (labels app.kubernetes.io/name=ipvs-leftovers,
    component=agent), in `namespace` or in any; exactly one, or KubeError."""
    from kubernetes import client

    apps = client.AppsV1Api(api)
    where = f"in namespace {namespace}" if namespace else "in any namespace"
    what = f"listing the ipvs-leftovers DaemonSet {where}"
    if namespace:
        found = call(
            what, apps.list_namespaced_daemon_set, namespace, label_selector=AGENT_SELECTOR
        )
    else:
        found = call(what, apps.list_daemon_set_for_all_namespaces, label_selector=AGENT_SELECTOR)
    items = list(found.items or [])
    if not items:
        raise KubeError(f"no DaemonSet labelled {AGENT_SELECTOR} {where}")
    if len(items) > 1:
        names = ", ".join(sorted(f"{d.metadata.namespace}/{d.metadata.name}" for d in items))
        raise KubeError(f"{len(items)} ipvs-leftovers DaemonSets ({names}): give --namespace")
    ds = items[0]
    containers = ds.spec.template.spec.containers or []
    container = next((c for c in containers if c.name == CONTAINER), None)
    if container is None or not container.image:
        raise KubeError(
            f"DaemonSet {ds.metadata.namespace}/{ds.metadata.name} has no container "
            f"{CONTAINER} with an image"
        )
    return AgentDaemonSet(
        ds.metadata.namespace,
        ds.metadata.name,
        container.image,
        tuple([*(container.command or []), *(container.args or [])]),
        ds.spec.template.spec.service_account_name or "default",
    )


def node_names(api: Any) -> set[str]:
    """The names of the cluster's Nodes (one list; KubeError on failure)."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    found = call("listing Nodes", core.list_node)
    return {n.metadata.name for n in found.items or []}
