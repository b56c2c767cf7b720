"""Every test is in a tier, by its folder (tests/conftest.py), and scripts/test-tier knows
every tier: a new folder of tests cannot drop out of the suite, nor a tier out of the script."""

from __future__ import annotations

import re

from tests.conftest import REPO, ROOTLESS_TIERS, TIERS, root_needed_line, tier_of


def test_every_test_file_has_a_tier() -> None:
    files = sorted((REPO / "tests").rglob("test_*.py"))
    assert len(files) > 50
    assert [str(f.relative_to(REPO)) for f in files if tier_of(f) is None] == []


def test_a_file_outside_the_tier_folders_has_none() -> None:
    assert tier_of(REPO / "tests" / "test_loose.py") is None
    assert tier_of(REPO / "tests" / "newfolder" / "test_x.py") is None
    assert tier_of(REPO / "bench" / "test_x.py") is None
    assert tier_of(REPO / "tests" / "fault" / "test_fuzz_bundle.py") == "fault"


def test_scripts_test_tier_runs_every_tier_and_the_docs_list_them() -> None:
    script = (REPO / "scripts" / "test-tier").read_text()
    cases = set(re.findall(r"^([a-z]+)\)", script, re.MULTILINE))
    assert set(TIERS.values()) <= cases
    table = (REPO / "tests" / "README.md").read_text()
    assert {t for t in set(TIERS.values()) if f"| `{t}` |" not in table} == set()


def test_the_root_line_is_one_line_naming_the_command() -> None:
    one = root_needed_line({"netns"})
    assert one == (
        "the netns tier needs root: sudo scripts/test --tier netns; without root, "
        "scripts/check runs the unit tier and the static checks"
    )
    many = root_needed_line({"vm", "fault"})
    assert many.startswith("the fault, vm tiers need root: sudo scripts/test --tier NAME")
    assert "\n" not in one + many
    assert {"unit"} == ROOTLESS_TIERS
