from pathlib import Path

from agent.cli.permissions import missing_capabilities
from agent.readers.kernel import Presence, presence


def test_presence_reads_only_files(tmp_path: Path) -> None:
    (tmp_path / "proc/net").mkdir(parents=True)
    (tmp_path / "sys/module/ip_set").mkdir(parents=True)
    (tmp_path / "proc/modules").write_text("nf_tables 1 0 - Live 0x0\n")
    assert presence("ip_set", tmp_path) is Presence.LOADED  # /sys/module
    assert presence("nf_tables", tmp_path) is Presence.LOADED  # /proc/modules
    assert presence("ip_vs", tmp_path) is Presence.ABSENT
    (tmp_path / "proc/net/ip_vs").write_text("")
    assert presence("ip_vs", tmp_path) is Presence.LOADED  # /proc/net hint


def test_kernel_without_module_support(tmp_path: Path) -> None:
    assert presence("nf_tables", tmp_path) is Presence.NO_MODULES


def test_capabilities() -> None:
    assert missing_capabilities("CapEff:\t000001ffffffffff\n", legacy_tables=True) == []
    assert missing_capabilities("CapEff:\t0000000000000000\n", legacy_tables=False) == [
        "CAP_NET_ADMIN"
    ]
    assert missing_capabilities("CapEff:\t0000000000001000\n", legacy_tables=False) == []
    assert missing_capabilities("CapEff:\t0000000000001000\n", legacy_tables=True) == [
        "CAP_NET_RAW"
    ]
