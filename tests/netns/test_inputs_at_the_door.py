"""Inputs refused at the door, end to end: the
agent run as a user runs it, in a throwaway namespace."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from lab import build
from lab.kube_proxy import start_fake_kube_proxy
from lab.scenarios import realistic_node
from tests.conftest import run_agent

pytestmark = pytest.mark.netns
CONFIRMED = {"mode": "nftables", "families": ["IPv4"], "last_sync_age": 2.0}


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def _rules(ns: str) -> list[str]:
    out = build.run(["ip", "netns", "exec", ns, "iptables-save"])
    return [line for line in out.splitlines() if not line.startswith("#")]


def test_the_trailing_underscore_variable_does_not_make_plain_cleanup_apply(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    """On a node where nftables mode is confirmed, `cleanup` with
    IPVS_LEFTOVERS_CLEANUP_APPLY_=1 in its environment applied (click named the variable after
    the parameter `apply_`). Now it only plans: no backup, nothing removed."""
    ns = netns()
    build.build(ns, realistic_node(nftables_table=True))
    before = _rules(ns)
    backups = tmp_path / "backups"
    with start_fake_kube_proxy(ns, CONFIRMED, tmp_path / "kp.json"):
        r = run_agent(
            ns,
            "cleanup",
            "--backup-dir",
            str(backups),
            "--lock-file",
            str(tmp_path / "lock"),
            env={"IPVS_LEFTOVERS_CLEANUP_APPLY_": "1"},
        )
    assert r.rc == 1, r.stderr  # leftovers present, nothing done
    assert "nftables mode confirmed: --apply would run this plan" in r.stdout
    assert not backups.exists() or not any(backups.iterdir())
    assert _rules(ns) == before


def test_a_symlinked_lock_file_is_refused_and_its_target_untouched(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    """`--lock-file` a symlink truncated its target and wrote the PID into it. Now the
    lock file is opened with O_NOFOLLOW: one line, exit 4, the target as it was."""
    target = tmp_path / "precious"
    target.write_text("operator's data\n")
    link = tmp_path / "cleanup.lock"
    link.symlink_to(target)
    r = run_agent(
        netns(), "cleanup", "--apply", "--lock-file", str(link), "--backup-dir", str(tmp_path)
    )
    assert r.rc == 4, (r.rc, r.stdout, r.stderr)
    line = _one_line(r.stderr)
    assert f"the lock file {link} is a symbolic link" in line and "nothing was changed" in line
    assert target.read_text() == "operator's data\n"
    assert link.is_symlink()


def _pem(tmp: Path, name: str) -> tuple[Path, Path]:
    key, cert = tmp / f"{name}-key.pem", tmp / f"{name}-cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_tls_errors_name_the_file(netns: Callable[[], str], tmp_path: Path) -> None:
    """OpenSSL says `[SSL] PEM lib` for a bad certificate and a bad key alike, and
    serve printed only that. Now one line names the option and the file at fault, exit 4."""
    cert, key = _pem(tmp_path, "a")
    other_cert, _ = _pem(tmp_path, "b")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a PEM file\n")
    unreadable = tmp_path / "unreadable.pem"
    unreadable.write_bytes(key.read_bytes())
    os.chmod(unreadable, 0)
    ns = netns()
    cases = [
        (garbage, key, f"--tls-cert {garbage} holds no PEM certificate"),
        (cert, garbage, f"--tls-key {garbage} holds no PEM private key"),
        (key, key, f"--tls-cert {key} holds no PEM certificate"),
        (other_cert, key, f"--tls-key {key} is not the private key of --tls-cert {other_cert}"),
    ]
    if os.geteuid() != 0:  # root reads a file of mode 000
        cases.append((cert, unreadable, f"cannot read --tls-key {unreadable}"))
    for c, k, want in cases:
        r = run_agent(
            ns, "serve", "--listen", "127.0.0.1:9437", "--tls-cert", str(c), "--tls-key", str(k)
        )
        assert r.rc == 4, (c, k, r.stderr)
        assert want in _one_line(r.stderr), r.stderr


def test_a_hard_linked_lock_file_is_refused_and_its_other_name_untouched(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    """`--lock-file` a hard link to another file (O_NOFOLLOW does not see one) truncated that
    file and wrote the PID into it. Now a lock file with more than one link is refused: one
    line, exit 4, the file as it was."""
    target = tmp_path / "precious"
    target.write_text("operator's data\n")
    link = tmp_path / "cleanup.lock"
    os.link(target, link)
    r = run_agent(
        netns(), "cleanup", "--apply", "--lock-file", str(link), "--backup-dir", str(tmp_path)
    )
    assert r.rc == 4, (r.rc, r.stdout, r.stderr)
    line = _one_line(r.stderr)
    assert f"the lock file {link} has 2 hard links" in line, line
    assert "nothing was changed" in line
    assert target.read_text() == "operator's data\n"
    assert os.stat(link).st_nlink == 2
