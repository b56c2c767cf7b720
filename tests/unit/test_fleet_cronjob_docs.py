"""docs/operations.md's "As a CronJob" section describes the shipped objects, not a sketch: every
object of daemonset/components/fleet (the chart's render, kept current by
scripts/render-manifests --check-stamp) by kind and name, every rule of its Role and
ClusterRole with exactly its verbs, every option the CronJob passes, and its schedule and
concurrency policy. A change to the chart's fleet objects that the docs do not follow fails
here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
COMPONENT = REPO / "daemonset" / "components" / "fleet"


def section() -> str:
    text = (REPO / "docs" / "operations.md").read_text()
    start = text.index("**As a CronJob.**")
    return text[start : text.index("**Auto-cleanup instead.**", start)]


def objects() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for name in ("fleet-rbac.yaml", "fleet-cronjob.yaml"):
        docs += [d for d in yaml.safe_load_all((COMPONENT / name).read_text()) if d]
    return docs


def test_every_shipped_object_is_named() -> None:
    """A row of the objects' table whose first cell names the kind and the object."""
    cells = [line.split("|")[1] for line in section().splitlines() if line.startswith("| ")]
    for obj in objects():
        name = obj["metadata"]["name"]
        if obj["kind"].startswith("Cluster"):  # named <namespace>-<fullname>-fleet
            name = name.replace("ipvs-leftovers-ipvs-leftovers", "<namespace>-ipvs-leftovers")
        assert any(
            f"`{name}`" in cell and re.search(rf"\b{obj['kind']}\b", cell) for cell in cells
        ), f"{obj['kind']} {name} not in docs/operations.md"


def test_every_rule_with_exactly_its_verbs() -> None:
    doc = re.sub(r"\s+", " ", section())
    for obj in objects():
        for rule in obj.get("rules", []) if obj["kind"] in ("Role", "ClusterRole") else []:
            (group,) = rule["apiGroups"]
            (resource,) = rule["resources"]
            verbs = ", ".join(f"`{v}`" for v in rule["verbs"])
            if rule.get("resourceNames"):
                (lease,) = rule["resourceNames"]
                want = f"{verbs} on the one Lease `{lease}`"
            else:
                want = f"{verbs} {resource}"
            assert want in doc, want
            assert f"({group})" in doc or (group == "" and "`list` nodes" in doc), group


def test_the_schedule_the_policy_and_every_option_the_cronjob_passes() -> None:
    doc = section()
    [cron] = [o for o in objects() if o["kind"] == "CronJob"]
    assert f"`{cron['spec']['schedule']}`" in doc
    assert f"`concurrencyPolicy: {cron['spec']['concurrencyPolicy']}`" in doc
    args = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert " ".join(args[:3]) == "fleet step --apply" and "`fleet step --apply`" in doc
    for arg in args[3:]:
        option = arg.split("=", 1)[0]
        assert f"`{option}`" in doc, option
    # and the options the values add when set
    for option in ("--bearer-token-file", "--cluster", "--alert-filter-regexp", "--days"):
        assert f"`{option}`" in doc, option
