"""The fake API server answers kube-proxy's calls (list, chunked watch, events) on loopback."""

from __future__ import annotations

import http.client
import json
import urllib.request

from tests.fake_apiserver import Cluster, Endpoint, FakeAPIServer, Node, Port, Service

SEL = "labelSelector=%21service.kubernetes.io%2Fheadless%2C%21service.kubernetes.io%2Fservice-proxy-name"


def _cluster() -> Cluster:
    return Cluster(
        node=Node("node-a", ("192.168.50.10", "fd00:50::10")),
        services=[
            Service(
                "web",
                ("10.96.1.1", "fd00:96::1"),
                (Port(80, target_port=8080, node_port=30080),),
                type="NodePort",
                endpoints=(Endpoint("10.244.0.10", "node-a"), Endpoint("fd00:244::10", "node-a")),
            )
        ],
    )


def _get(api: FakeAPIServer, path: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    with urllib.request.urlopen(api.url + path, timeout=5) as r:
        return r.status, json.loads(r.read())


def test_node_and_lists() -> None:
    with FakeAPIServer(_cluster()) as api:
        code, node = _get(api, "/api/v1/nodes/node-a")
        assert code == 200
        assert [a["address"] for a in node["status"]["addresses"]][:2] == [
            "192.168.50.10",
            "fd00:50::10",
        ]
        _, svcs = _get(api, f"/api/v1/services?{SEL}&limit=500&resourceVersion=0")
        assert svcs["kind"] == "ServiceList" and int(svcs["metadata"]["resourceVersion"]) > 0
        (svc,) = svcs["items"]
        assert svc["spec"]["clusterIPs"] == ["10.96.1.1", "fd00:96::1"]
        assert svc["spec"]["ipFamilies"] == ["IPv4", "IPv6"]
        assert svc["spec"]["ports"][0] == {
            "name": "",
            "protocol": "TCP",
            "port": 80,
            "targetPort": 8080,
            "nodePort": 30080,
        }
        _, slices = _get(api, f"/apis/discovery.k8s.io/v1/endpointslices?{SEL}")
        assert sorted(s["addressType"] for s in slices["items"]) == ["IPv4", "IPv6"]
        assert {s["endpoints"][0]["addresses"][0] for s in slices["items"]} == {
            "10.244.0.10",
            "fd00:244::10",
        }
        _, nodes = _get(api, "/api/v1/nodes?fieldSelector=metadata.name%3Dnode-a")
        assert [n["metadata"]["name"] for n in nodes["items"]] == ["node-a"]


def test_unknown_path_is_404_status() -> None:
    with FakeAPIServer(_cluster()) as api:
        try:
            urllib.request.urlopen(api.url + "/api/v1/nodes/other", timeout=5)
        except urllib.error.HTTPError as exc:
            assert exc.code == 404
            assert json.loads(exc.read())["kind"] == "Status"
        else:
            raise AssertionError("expected 404")


def test_events_post_is_201() -> None:
    with FakeAPIServer(_cluster()) as api:
        req = urllib.request.Request(
            api.url + "/apis/events.k8s.io/v1/namespaces/default/events",
            data=b'{"kind":"Event","reason":"Starting"}',
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.status == 201
        assert api.posted == [
            {"kind": "Event", "reason": "Starting", "metadata": {"resourceVersion": "1"}}
        ]


def test_watch_streams_pushed_events() -> None:
    with FakeAPIServer(_cluster()) as api:
        _, lst = _get(api, "/api/v1/services")
        rv = lst["metadata"]["resourceVersion"]
        host, port = api.httpd.server_address[:2]
        conn = http.client.HTTPConnection(str(host), port, timeout=10)
        conn.request(
            "GET", f"/api/v1/services?watch=true&allowWatchBookmarks=true&resourceVersion={rv}"
        )
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Transfer-Encoding") == "chunked"
        new = Service("dns", ("10.96.0.10",), (Port(53, "UDP"),))
        api.push("apply", new)
        added = json.loads(resp.readline())
        assert added["type"] == "ADDED" and added["object"]["metadata"]["name"] == "dns"
        api.push("apply", Service("dns", ("10.96.0.10",), (Port(53, "UDP"), Port(53, "TCP"))))
        modified = json.loads(resp.readline())
        assert modified["type"] == "MODIFIED" and len(modified["object"]["spec"]["ports"]) == 2
        api.push("delete", new)
        deleted = json.loads(resp.readline())
        assert deleted["type"] == "DELETED" and deleted["object"]["metadata"]["name"] == "dns"
        assert int(deleted["object"]["metadata"]["resourceVersion"]) > int(rv)
        # The list after the changes shows the current state and a newer resourceVersion.
        _, after = _get(api, "/api/v1/services")
        assert [s["metadata"]["name"] for s in after["items"]] == ["web"]
        conn.close()


def test_watch_of_endpointslices_sees_only_its_resource() -> None:
    with FakeAPIServer(_cluster()) as api:
        host, port = api.httpd.server_address[:2]
        conn = http.client.HTTPConnection(str(host), port, timeout=10)
        conn.request("GET", "/apis/discovery.k8s.io/v1/endpointslices?watch=true&resourceVersion=1")
        resp = conn.getresponse()
        api.push(
            "apply",
            Service("db", ("10.96.0.20",), (Port(5432),), endpoints=(Endpoint("10.244.1.5"),)),
        )
        ev = json.loads(resp.readline())
        assert ev["type"] == "ADDED" and ev["object"]["kind"] == "EndpointSlice"
        assert ev["object"]["endpoints"][0]["addresses"] == ["10.244.1.5"]
        conn.close()
