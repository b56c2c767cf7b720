"""The exported series: label names that survive a scrape, and kube-proxy's re-exported state."""

from __future__ import annotations

from agent.classify import classify
from agent.collection import Collection
from agent.snapshot import KubeProxy, Reading
from agent.views.metrics import families
from tests.unit.builders import NOW, kube_proxy, snapshot

# Target labels Prometheus setups commonly attach (Kubernetes SD relabelling, the Prometheus
# Operator, kube-prometheus, cluster-wide external labels). A series label with one of these
# names is renamed exported_<name> at scrape time (honor_labels: false), and every rule that
# selects on it silently stops matching.
TARGET_LABELS = {
    "job", "instance", "node", "namespace", "pod", "container", "service", "endpoint",
    "cluster", "region", "zone", "team", "owner", "app", "env", "environment", "tenant",
}  # fmt: skip


def samples(kp: KubeProxy) -> dict[str, float]:
    snap = snapshot(kp=kp)
    col = Collection(snap, classify(snap, NOW), 0.0)
    out = {}
    for fam in families(col):
        for s in fam.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def test_no_exported_label_collides_with_a_common_target_label() -> None:
    snap = snapshot()
    col = Collection(snap, classify(snap, NOW), 0.0)
    used = {label for fam in families(col) for s in fam.samples for label in s.labels}
    assert used & TARGET_LABELS == set()
    assert "class" in used  # the IPVS counts' kube-proxy/foreign split


def test_kube_proxy_health_last_sync_and_failures_are_re_exported() -> None:
    got = samples(kube_proxy("nftables", families=("ipv4", "ipv6"), sync_age=3600.0))
    p = "ipvs_leftovers_kube_proxy_"
    assert got[f"{p}healthy"] == 1
    assert got[f'{p}last_sync_timestamp_seconds{{family="ipv4"}}'] == NOW - 3600.0
    assert got[f'{p}last_sync_timestamp_seconds{{family="ipv6"}}'] == NOW - 3600.0
    assert got[f"{p}nftables_sync_failures_total"] == 0


def test_an_unhealthy_kube_proxy_is_healthy_0() -> None:
    assert samples(kube_proxy("nftables", healthy=False))["ipvs_leftovers_kube_proxy_healthy"] == 0


def test_what_kube_proxy_did_not_give_is_left_out_not_zero() -> None:
    down = samples(kube_proxy(None))
    assert not any(k.startswith("ipvs_leftovers_kube_proxy_healthy") for k in down)
    assert not any("last_sync_timestamp" in k for k in down)
    assert not any("sync_failures" in k for k in down)
    assert down['ipvs_leftovers_kube_proxy_mode_info{mode="unknown"}'] == 1
    # iptables mode has no nftables failure counter: none is made up
    ipt = samples(kube_proxy("iptables"))
    assert not any("sync_failures" in k for k in ipt)


def test_an_unlabelled_last_sync_is_exported_without_a_family() -> None:
    kp = kube_proxy("nftables")
    assert kp.metrics.data is not None
    metrics = type(kp.metrics.data)(last_sync={None: NOW - 5.0}, nftables_sync_failures=2.0)
    got = samples(KubeProxy(kp.proxy_mode, Reading("ok", metrics), kp.healthz, NOW))
    assert got['ipvs_leftovers_kube_proxy_last_sync_timestamp_seconds{family=""}'] == NOW - 5.0
    assert got["ipvs_leftovers_kube_proxy_nftables_sync_failures_total"] == 2


def _all(snap: object) -> dict[str, float]:
    from agent.snapshot import Snapshot

    assert isinstance(snap, Snapshot)
    col = Collection(snap, classify(snap, NOW), 0.0)
    out = {}
    for fam in families(col):
        for s in fam.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def test_unknown_kube_objects_are_counted_by_kind_and_every_kind_is_there() -> None:
    # a KUBE-* chain no rule knows, and a jump into it from a built-in chain (docs/contract.md#ownership)
    nft = "\n".join(
        [
            "*filter",
            ":INPUT ACCEPT [0:0]",
            ":KUBE-SOMETHING-NEW - [0:0]",
            "-A INPUT -j KUBE-SOMETHING-NEW",
            "COMMIT",
        ]
    )
    got = _all(snapshot(nft=nft + "\n"))
    p = "ipvs_leftovers_unknown_kube_objects"
    assert got[f'{p}{{kind="chain"}}'] == 1
    for kind in ("ipvs-service", "ipset", "link"):
        assert got[f'{p}{{kind="{kind}"}}'] == 0
    clean = _all(snapshot())
    assert {k: v for k, v in clean.items() if k.startswith(p)} == {
        f'{p}{{kind="{k}"}}': 0.0 for k in ("chain", "ipset", "ipvs-service", "jump-rule", "link")
    }


def test_nftables_kernel_ready_is_exported_from_the_kernel_release() -> None:
    import dataclasses

    from agent.snapshot import Kernel

    snap = snapshot()
    assert _all(snap)["ipvs_leftovers_nftables_kernel_ready"] == 1  # 6.1.0
    old = dataclasses.replace(snap, kernel=Reading("ok", Kernel(release="5.10.0-28-amd64")))
    assert _all(old)["ipvs_leftovers_nftables_kernel_ready"] == 0


def test_every_exported_series_is_in_the_contract() -> None:
    """docs/contract.md#metrics is the one list of metrics: a new series must be written there."""
    from tests.conftest import REPO

    text = (REPO / "docs" / "contract.md").read_text()
    snap = snapshot(kp=kube_proxy("nftables"))
    col = Collection(snap, classify(snap, NOW), 0.0)
    names = {s.name for fam in families(col) for s in fam.samples}
    assert len(names) >= 19
    assert sorted(n for n in names if f"`{n}`" not in text) == []
