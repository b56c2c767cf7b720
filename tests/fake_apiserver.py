"""A fake Kubernetes API server, just enough for real kube-proxy (its client: k8s.io/client-go).

It answers, with JSON, the calls kube-proxy v1.30 makes: `GET /api/v1/nodes/<name>`, list and
watch of Services, EndpointSlices and Nodes (a watch is a chunked stream held open, one JSON event
per line), and `POST .../events` (201). The cluster is described declaratively (`Cluster`,
`Service`, `Port`, `Endpoint` dataclasses); `FakeAPIServer.push` adds, modifies or deletes a
Service (and its EndpointSlices) while kube-proxy runs, which every open watch then receives.

Only the standard library: it runs on the host for its unit tests and in the VM for the
real-kube-proxy tier.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import select
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CREATED = "2024-01-01T00:00:00Z"


@dataclass(frozen=True)
class Port:
    port: int
    protocol: str = "TCP"
    target_port: int | None = None  # default: the same as `port`
    node_port: int | None = None
    name: str = ""


@dataclass(frozen=True)
class Endpoint:
    address: str
    node: str | None = None  # the node it runs on: local endpoints carry the node's name
    ready: bool = True


@dataclass(frozen=True)
class Service:
    name: str
    cluster_ips: tuple[str, ...]  # first = primary family; two = dual-stack
    ports: tuple[Port, ...]
    type: str = "ClusterIP"  # ClusterIP | NodePort | LoadBalancer
    namespace: str = "default"
    endpoints: tuple[Endpoint, ...] = ()
    external_ips: tuple[str, ...] = ()
    lb_ingress: tuple[str, ...] = ()
    lb_source_ranges: tuple[str, ...] = ()
    external_traffic_policy: str = "Cluster"
    health_check_node_port: int | None = None
    session_affinity: str = "None"  # None | ClientIP


@dataclass(frozen=True)
class Node:
    name: str
    addresses: tuple[str, ...]  # InternalIP addresses, primary family first
    pod_cidrs: tuple[str, ...] = ()


@dataclass
class Cluster:
    node: Node
    services: list[Service] = field(default_factory=list)


def _family(address: str) -> str:
    return "IPv6" if ipaddress.ip_address(address.split("/")[0]).version == 6 else "IPv4"


def _meta(name: str, namespace: str | None, rv: int, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "uid": f"uid-{namespace or ''}-{name}",
        "resourceVersion": str(rv),
        "creationTimestamp": CREATED,
        **extra,
    }
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def node_object(node: Node, rv: int) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if node.pod_cidrs:
        spec = {"podCIDR": node.pod_cidrs[0], "podCIDRs": list(node.pod_cidrs)}
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": _meta(node.name, None, rv, labels={"kubernetes.io/hostname": node.name}),
        "spec": spec,
        "status": {
            "addresses": [{"type": "InternalIP", "address": a} for a in node.addresses]
            + [{"type": "Hostname", "address": node.name}],
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def service_object(svc: Service, rv: int) -> dict[str, Any]:
    ports = []
    for p in svc.ports:
        port: dict[str, Any] = {
            "name": p.name,
            "protocol": p.protocol,
            "port": p.port,
            "targetPort": p.target_port or p.port,
        }
        if p.node_port is not None:
            port["nodePort"] = p.node_port
        ports.append(port)
    families = [_family(ip) for ip in svc.cluster_ips]
    spec: dict[str, Any] = {
        "type": svc.type,
        "clusterIP": svc.cluster_ips[0],
        "clusterIPs": list(svc.cluster_ips),
        "ipFamilies": families,
        "ipFamilyPolicy": "RequireDualStack" if len(families) > 1 else "SingleStack",
        "ports": ports,
        "sessionAffinity": svc.session_affinity,
        "internalTrafficPolicy": "Cluster",
    }
    if svc.session_affinity == "ClientIP":
        spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": 10800}}
    if svc.type in ("NodePort", "LoadBalancer"):
        spec["externalTrafficPolicy"] = svc.external_traffic_policy
    if svc.external_ips:
        spec["externalIPs"] = list(svc.external_ips)
    if svc.lb_source_ranges:
        spec["loadBalancerSourceRanges"] = list(svc.lb_source_ranges)
    if svc.health_check_node_port is not None:
        spec["healthCheckNodePort"] = svc.health_check_node_port
    status: dict[str, Any] = {"loadBalancer": {}}
    if svc.lb_ingress:
        status["loadBalancer"] = {"ingress": [{"ip": ip} for ip in svc.lb_ingress]}
    return {
        "kind": "Service",
        "apiVersion": "v1",
        "metadata": _meta(svc.name, svc.namespace, rv),
        "spec": spec,
        "status": status,
    }


def endpoint_slice_objects(svc: Service, rv: int) -> list[dict[str, Any]]:
    """One EndpointSlice per IP family of the Service, as the EndpointSlice controller makes."""
    slices = []
    for family in dict.fromkeys(_family(ip) for ip in svc.cluster_ips):
        eps = [e for e in svc.endpoints if _family(e.address) == family]
        slices.append(
            {
                "kind": "EndpointSlice",
                "apiVersion": "discovery.k8s.io/v1",
                "metadata": _meta(
                    f"{svc.name}-{family.lower()}",
                    svc.namespace,
                    rv,
                    labels={
                        "kubernetes.io/service-name": svc.name,
                        "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                    },
                    ownerReferences=[
                        {
                            "apiVersion": "v1",
                            "kind": "Service",
                            "name": svc.name,
                            "uid": f"uid-{svc.namespace}-{svc.name}",
                        }
                    ],
                ),
                "addressType": family,
                "endpoints": [
                    {
                        "addresses": [e.address],
                        "conditions": {"ready": e.ready, "serving": e.ready, "terminating": False},
                        **({"nodeName": e.node} if e.node else {}),
                    }
                    for e in eps
                ],
                "ports": [
                    {
                        "name": p.name,
                        "protocol": p.protocol,
                        "port": p.target_port or p.port,
                    }
                    for p in svc.ports
                ],
            }
        )
    return slices


# The resources kube-proxy lists and watches, by URL path.
RESOURCES = {
    "/api/v1/services": ("services", "ServiceList", "v1"),
    "/apis/discovery.k8s.io/v1/endpointslices": (
        "endpointslices",
        "EndpointSliceList",
        "discovery.k8s.io/v1",
    ),
    "/api/v1/nodes": ("nodes", "NodeList", "v1"),
}


class _Store:
    """Objects by resource and key, plus the ordered history of events for watches."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.rv = 1
        self.objects: dict[str, dict[str, dict[str, Any]]] = {
            r: {} for r, _, _ in RESOURCES.values()
        }
        self.events: list[tuple[int, str, str, dict[str, Any]]] = []  # (rv, resource, type, obj)
        self.closed = False

    @staticmethod
    def key(obj: dict[str, Any]) -> str:
        meta = obj["metadata"]
        return f"{meta.get('namespace', '')}/{meta['name']}"

    def put(self, resource: str, obj: dict[str, Any], record: bool) -> None:
        """Caller holds `cond`. `record`: an event for watchers (not for the initial state)."""
        k = self.key(obj)
        kind = "MODIFIED" if k in self.objects[resource] else "ADDED"
        self.objects[resource][k] = obj
        if record:
            self.events.append((int(obj["metadata"]["resourceVersion"]), resource, kind, obj))

    def delete(self, resource: str, obj: dict[str, Any]) -> None:
        k = self.key(obj)
        if self.objects[resource].pop(k, None) is not None:
            self.events.append((int(obj["metadata"]["resourceVersion"]), resource, "DELETED", obj))


class FakeAPIServer:
    """`with FakeAPIServer(cluster, ("127.0.0.1", 0)) as api:` serves until the block ends."""

    def __init__(self, cluster: Cluster, listen: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        self.cluster = cluster
        self.store = _Store()
        self.requests: list[tuple[str, str]] = []  # (method, path+query) in arrival order
        self.posted: list[dict[str, Any]] = []
        with self.store.cond:
            self.store.put("nodes", node_object(cluster.node, self.store.rv), record=False)
            for svc in cluster.services:
                self._put_service(svc, record=False)
        handler = type("Handler", (_Handler,), {"api": self})
        family = ThreadingHTTPServer
        if ":" in listen[0]:
            family = type("V6Server", (ThreadingHTTPServer,), {"address_family": 10})
        self.httpd = family(listen, handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        host = f"[{host}]" if ":" in str(host) else host
        return f"http://{host}:{port}"

    def kubeconfig(self) -> str:
        return json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                "users": [{"name": "fake", "user": {}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                "current-context": "fake",
            }
        )

    def start(self) -> FakeAPIServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        with self.store.cond:
            self.store.closed = True
            self.store.cond.notify_all()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> FakeAPIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _put_service(self, svc: Service, record: bool) -> None:
        st = self.store
        st.rv += 1
        st.put("services", service_object(svc, st.rv), record)
        for es in endpoint_slice_objects(svc, st.rv):
            st.rv += 1
            es["metadata"]["resourceVersion"] = str(st.rv)
            st.put("endpointslices", es, record)

    def push(self, action: str, svc: Service) -> None:
        """Add/modify (`"apply"`) or delete (`"delete"`) a Service and its EndpointSlices."""
        with self.store.cond:
            if action == "apply":
                self.cluster.services = [s for s in self.cluster.services if s.name != svc.name]
                self.cluster.services.append(svc)
                self._put_service(svc, record=True)
            elif action == "delete":
                self.cluster.services = [s for s in self.cluster.services if s.name != svc.name]
                for es in endpoint_slice_objects(svc, self.store.rv):
                    self.store.rv += 1
                    es["metadata"]["resourceVersion"] = str(self.store.rv)
                    self.store.delete("endpointslices", es)
                self.store.rv += 1
                self.store.delete("services", service_object(svc, self.store.rv))
            else:
                raise ValueError(f"unknown action {action!r}")
            self.store.cond.notify_all()

    def list_doc(self, resource: str, kind: str, api_version: str) -> dict[str, Any]:
        with self.store.cond:
            items = list(self.store.objects[resource].values())
            rv = self.store.rv
        return {
            "kind": kind,
            "apiVersion": api_version,
            "metadata": {"resourceVersion": str(rv)},
            "items": items,
        }

    def watch(self, resource: str, since: int) -> Iterator[dict[str, Any] | None]:
        """Events newer than `since`; None now and then (a keep-alive point), ends on stop."""
        seen = 0
        st = self.store
        while True:
            with st.cond:
                new = [e for e in st.events[seen:] if e[1] == resource and e[0] > since]
                seen = len(st.events)
                if not new and not st.closed:
                    st.cond.wait(timeout=1.0)
                closed = st.closed
            for _, _, kind, obj in new:
                yield {"type": kind, "object": obj}
            if closed:
                return
            yield None


class _Handler(BaseHTTPRequestHandler):
    api: FakeAPIServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # kube-proxy retries noisily; tests read `api.requests` instead

    def _json(self, code: int, doc: dict[str, Any]) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _not_found(self) -> None:
        self._json(
            404,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f"{self.path} not found",
                "reason": "NotFound",
                "code": 404,
            },
        )

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        self.api.requests.append(("GET", self.path))
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        node = self.api.cluster.node
        if url.path == f"/api/v1/nodes/{node.name}":
            with self.api.store.cond:
                obj = self.api.store.objects["nodes"].get(f"/{node.name}")
            return self._json(200, obj) if obj else self._not_found()
        if url.path not in RESOURCES:
            return self._not_found()
        resource, kind, api_version = RESOURCES[url.path]
        if query.get("watch", ["false"])[0] not in ("true", "1"):
            return self._json(200, self.list_doc(resource, kind, api_version))
        if query.get("sendInitialEvents", ["false"])[0] == "true":
            # client-go's streaming list (WatchListClient, on in kube-proxy >= 1.35): the
            # current objects as ADDED, then a BOOKMARK marking the end of the initial events;
            # without it the informer never syncs.
            doc = self.list_doc(resource, kind, api_version)
            rv = doc["metadata"]["resourceVersion"]
            bookmark = {
                "kind": kind.removesuffix("List"),
                "apiVersion": api_version,
                "metadata": {
                    "resourceVersion": rv,
                    "annotations": {"k8s.io/initial-events-end": "true"},
                },
            }
            initial = [{"type": "ADDED", "object": o} for o in doc["items"]]
            initial.append({"type": "BOOKMARK", "object": bookmark})
            return self._stream(resource, int(rv), initial)
        self._stream(resource, int(query.get("resourceVersion", ["0"])[0] or 0))

    def list_doc(self, resource: str, kind: str, api_version: str) -> dict[str, Any]:
        return self.api.list_doc(resource, kind, api_version)

    def _stream(
        self, resource: str, since: int, initial: list[dict[str, Any]] | None = None
    ) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for event in itertools.chain(initial or (), self.api.watch(resource, since)):
                if event is None:
                    if self._client_gone():
                        break
                    continue
                line = json.dumps(event).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True

    def _client_gone(self) -> bool:
        """The client closed the watch (kube-proxy stopped): its socket reads EOF."""
        readable, _, _ = select.select([self.connection], [], [], 0)
        if not readable:
            return False
        try:
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        self.api.requests.append(("POST", self.path))
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            doc = json.loads(raw or b"{}")
        except ValueError:
            doc = {}
        self.api.posted.append(doc)
        if isinstance(doc, dict):
            doc.setdefault("metadata", {})["resourceVersion"] = "1"
        self._json(201, doc if isinstance(doc, dict) else {})
