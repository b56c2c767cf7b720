"""Which reads each command asks for: counting the nftables-mode table's chains and elements
is most of a large node's read time, and only the audit report shows those counts."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from agent import cli
from agent.cli import common
from agent.collect import Options


class _Stop(Exception):
    pass


@pytest.mark.parametrize(
    ("args", "detail"),
    [
        (["audit"], True),
        (["audit", "--json"], True),
        (["cleanup"], False),
        (["cleanup", "--apply"], False),
    ],
)
def test_nftables_detail_only_where_shown(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: list[str], detail: bool
) -> None:
    seen: list[Options] = []

    def record(opts: Options, max_sync_age: float, config: bool = False) -> None:
        seen.append(opts)
        raise _Stop

    monkeypatch.setattr(common, "collection", record)
    monkeypatch.setattr(common, "require_permission", lambda: None)
    extra = ["--lock-file", f"{tmp_path}/lock", "--backup-dir", f"{tmp_path}/b"]
    result = CliRunner().invoke(cli.main, args + (extra if args[0] == "cleanup" else []))
    assert isinstance(result.exception, _Stop), result.output
    assert [o.nftables_detail for o in seen] == [detail]
