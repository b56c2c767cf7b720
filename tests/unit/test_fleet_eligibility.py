"""Eligibility on plain data: the first failed check, in the documented order; anything
Prometheus does not have fails its check."""

from __future__ import annotations

import dataclasses

import pytest

from agent.fleet.eligibility import CHECKS, NodeData, Params, clean_after, evaluate

NOW = 1_800_000_000.0
P = Params(hold_down=86400, max_gap=120, freshness=120)
READY = NodeData(
    "lab",
    "n1",
    up=1,
    last_sample=NOW - 20,
    sources_min=1,
    healthy=1,
    confirmed_now=1,
    confirmed_min=1,
    coverage=1.0,
    foreign_max=0,
    stale=1,
    iptables_mode_chains=0,
    kube_ipvs0=1,
)


def check(**changes: object) -> str:
    v = evaluate(dataclasses.replace(READY, **changes), P, NOW)  # type: ignore[arg-type]
    assert v.eligible == (v.check == "")
    return v.check or "eligible"


def test_a_ready_node_is_eligible() -> None:
    assert check() == "eligible"
    assert check(stale=0, iptables_mode_chains=3) == "eligible"  # iptables-mode chains only


@pytest.mark.parametrize(
    ("changes", "want"),
    [
        ({"up": 0}, "fresh"),
        ({"up": None}, "fresh"),
        ({"last_sample": NOW - 121}, "fresh"),
        ({"last_sample": None}, "fresh"),
        ({"sources_min": 0}, "sources"),
        ({"sources_min": None}, "sources"),
        ({"healthy": 0}, "kube-proxy"),
        ({"healthy": None}, "kube-proxy"),
        ({"confirmed_min": 0}, "confirmed"),
        ({"confirmed_now": 0}, "confirmed"),
        ({"confirmed_min": None}, "confirmed"),
        ({"coverage": 0.999}, "no-gap"),
        ({"coverage": None}, "no-gap"),
        ({"foreign_max": 1}, "foreign"),
        ({"foreign_max": None}, "foreign"),
        ({"stale": 0}, "leftovers"),
        ({"stale": None, "iptables_mode_chains": None}, "leftovers"),
    ],
)
def test_each_missing_or_bad_value_fails_its_check(changes: dict[str, object], want: str) -> None:
    assert check(**changes) == want


def test_the_first_failed_check_in_order_is_the_one_reported() -> None:
    bad: dict[str, dict[str, object]] = {
        "fresh": {"up": 0},
        "sources": {"sources_min": 0},
        "kube-proxy": {"healthy": 0},
        "confirmed": {"confirmed_min": 0},
        "no-gap": {"coverage": 0.5},
        "foreign": {"foreign_max": 2},
        "leftovers": {"stale": 0},
    }
    assert list(bad) == list(CHECKS)
    for i, name in enumerate(CHECKS):
        changes: dict[str, object] = {}
        for later in CHECKS[i:]:
            changes.update(bad[later])
        assert check(**changes) == name


def test_the_bake_wants_samples_newer_than_the_job_showing_the_node_clean() -> None:
    done = NOW - 60
    clean = dataclasses.replace(READY, stale=0, kube_ipvs0=0, iptables_mode_chains=0)
    assert clean_after(clean, done) == ""
    assert clean_after(dataclasses.replace(clean, last_sample=done - 1), done).startswith(
        "no sample"
    )
    assert clean_after(dataclasses.replace(clean, kube_ipvs0=1), done) == "kube-ipvs0 still present"
    assert clean_after(dataclasses.replace(clean, stale=1), done) == "leftovers still reported"
    assert clean_after(dataclasses.replace(clean, healthy=0), done) == "kube-proxy not healthy"
    assert clean_after(dataclasses.replace(clean, confirmed_now=0), done) == (
        "nftables mode no longer confirmed"
    )
    assert clean_after(dataclasses.replace(clean, stale=None), done) == "stale unknown"
