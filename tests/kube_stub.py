"""A stand-in for the Kubernetes API, for the operator commands' unit tests: answers the
lists the official client makes (DaemonSets, Nodes, Jobs: what a `fleet step` without --apply
reads), with whatever status a test sets, and records every request. (The end-to-end tests use the real kube-apiserver: tests/control_plane.py.)"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def daemonset(namespace: str, image: str, args: list[str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "ipvs-leftovers",
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": "ipvs-leftovers",
                "app.kubernetes.io/component": "agent",
            },
        },
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": "ipvs-leftovers"}},
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": "ipvs-leftovers"}},
                "spec": {
                    "containers": [
                        {"name": "ipvs-leftovers", "image": image, "args": args or ["serve"]}
                    ]
                },
            },
        },
    }


@dataclass
class Stub:
    daemonsets: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    requests: list[str] = field(default_factory=list)
    url: str = ""

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "c", "cluster": {"server": self.url}}],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                }
            )
        )
        return path


def _list(kind: str, api_version: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kind": kind, "apiVersion": api_version, "items": items,
            "metadata": {"resourceVersion": "1"}}  # fmt: skip


@contextmanager
def kube_stub(stub: Stub) -> Iterator[Stub]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

        def do_GET(self) -> None:  # noqa: N802
            stub.requests.append(self.path)
            path = self.path.split("?", 1)[0]
            if stub.status != 200:
                body: dict[str, Any] = {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "message": f"stub says {stub.status}",
                    "code": stub.status,
                }
            elif path == "/apis/apps/v1/daemonsets" or (
                path.startswith("/apis/apps/v1/namespaces/") and path.endswith("/daemonsets")
            ):
                ns = path.split("/")[5] if "/namespaces/" in path else None
                items = [d for d in stub.daemonsets if ns in (None, d["metadata"]["namespace"])]
                body = {"kind": "DaemonSetList", "apiVersion": "apps/v1", "items": items,
                        "metadata": {"resourceVersion": "1"}}  # fmt: skip
            elif path == "/api/v1/nodes":
                body = _list("NodeList", "v1", stub.nodes)
            elif path.startswith("/apis/batch/v1/namespaces/") and path.endswith("/jobs"):
                ns = path.split("/")[5]
                items = [j for j in stub.jobs if j["metadata"]["namespace"] == ns]
                body = _list("JobList", "batch/v1", items)
            else:
                body = {"kind": "Status", "code": 404, "message": "not here"}
                self._send(404, body)
                return
            self._send(stub.status, body)

        def _send(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    stub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        server.shutdown()
        server.server_close()
