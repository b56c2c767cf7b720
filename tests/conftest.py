"""Shared fixtures: throwaway network namespaces and the agent run inside them.

The agent acts on the namespace it runs in, so tests run it with `ip netns exec`, exactly as a
DaemonSet runs it in the host's namespace. Nothing here touches the machine's own namespace.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the lab package lives beside the agent

from lab import build as lab_build  # noqa: E402
from tests.agent_hooks import COMMAND as AGENT_HOOKS  # noqa: E402
from tests.agent_hooks import HOOKS  # noqa: E402

AGENT = str(Path(sys.executable).with_name("ipvs-leftovers"))


def agent_for(*args: str) -> list[str]:
    """The command that runs the agent with `args`: the shipped ipvs-leftovers, or the tests'
    entry point (tests/agent_hooks.py) when `args` hold one of its hooks, which no shipped
    command has."""
    hooked = any(a.partition("=")[0] in HOOKS for a in args)
    return list(AGENT_HOOKS) if hooked else [AGENT]


IN_VM = os.environ.get("IPVS_LEFTOVERS_IN_VM") == "1"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--require-vm",
        action="store_true",
        help="fail (not skip) when the VM tier cannot run: IPVS or dummy unavailable",
    )


# A test's tier is the folder it is in (scripts/test --tier NAME runs one): the marker is added
# here from the path, so a file that forgets its `pytestmark` still runs with its tier.
TIERS = {
    "unit": "unit",
    "netns": "netns",
    "lab_selftest": "netns",
    "fault": "fault",
    "image": "image",
    "prometheus": "prometheus",
    "vm": "vm",
    "realkp": "realkp",
    "cluster": "cluster",
    "manifests": "manifests",
    "control_plane_selftest": "upstream",
}
# The one tier that needs neither root nor anything scripts/install-deps installs.
ROOTLESS_TIERS = {"unit"}


def tier_of(path: Path) -> str | None:
    """The tier of a test file: the folder under tests/ it is in (None: in no tier)."""
    try:
        parts = path.resolve().relative_to(REPO / "tests").parts
    except ValueError:
        return None
    return TIERS.get(parts[0]) if len(parts) > 1 else None


def root_needed_line(tiers: set[str]) -> str:
    """The one line a run without root ends with when it selected tests that need root."""
    if len(tiers) == 1:
        (tier,) = tiers
        how = f"the {tier} tier needs root: sudo scripts/test --tier {tier}"
    else:
        how = (
            f"the {', '.join(sorted(tiers))} tiers need root: sudo scripts/test --tier NAME "
            "for one, sudo scripts/test for all"
        )
    return f"{how}; without root, scripts/check runs the unit tier and the static checks"


def pytest_itemcollected(item: pytest.Item) -> None:
    # as each test is collected: before `-m` selects by the markers
    tier = tier_of(item.path)
    if tier is not None:
        item.add_marker(getattr(pytest.mark, tier))


@pytest.hookimpl(trylast=True)  # after `-m` and after any plugin that reorders (pytest-randomly)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    strays = sorted({str(i.path) for i in items if tier_of(i.path) is None})
    if strays:
        raise pytest.UsageError(
            f"{strays[0]}: in no tier (put it in a folder that tests/conftest.py TIERS names)"
        )
    # A kernel that has loaded no module yet cannot be made again without a boot: the test
    # that needs one runs first, by its marker (not its file's name).
    items.sort(key=lambda i: "pristine" not in i.keywords)
    pristine = any("pristine" in i.keywords for i in items)
    if IN_VM and pristine and hasattr(config, "workerinput"):
        # pytest-xdist hands each worker tests as it frees up: "first" holds on none of them
        # (outside the VM the VM tier is skipped below, so -n there is harmless).
        raise pytest.UsageError(
            "a test marked pristine runs first in its boot, which pytest-xdist cannot "
            "promise: run it without -n (scripts/test runs the VM tier so)"
        )
    rooted = {t for i in items if (t := tier_of(i.path)) not in ROOTLESS_TIERS and t}
    if os.geteuid() != 0 and rooted:
        # Decided: such a run fails at once, before any test, with one line; never a pass
        # with those tests skipped (tests/README.md).
        raise pytest.UsageError(root_needed_line(rooted))
    if IN_VM:
        return
    for item in items:
        if "vm" in item.keywords or "realkp" in item.keywords or "cluster" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="VM tier: scripts/vm-run runs it"))


@pytest.fixture(scope="session", autouse=True)
def _vm_tier_guard(request: pytest.FixtureRequest) -> None:
    """With --require-vm, a run outside the VM is an error, not a quiet skip of the VM tier."""
    if request.config.getoption("--require-vm") and not IN_VM:
        pytest.fail("--require-vm: not inside the VM, so the VM tier did not run", pytrace=False)


@pytest.fixture(autouse=True)
def _a_lock_of_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Every agent a test starts takes a cleanup lock of the test's own unless the test names
    one: the machine's /run/ipvs-leftovers/cleanup.lock is taken without waiting, so two
    tests on workers side by side that both fell back to it refused each other (exit 6).
    Within one test, serve, cleanup and restore still share this one lock, as on a node."""
    lock = tmp_path_factory.mktemp("lock") / "cleanup.lock"
    for command in ("CLEANUP", "RESTORE", "SERVE"):
        monkeypatch.setenv(f"IPVS_LEFTOVERS_{command}_LOCK_FILE", str(lock))


@pytest.fixture(autouse=True)
def _alone_or_beside(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Under pytest-xdist, a test marked `alone` runs with no other test of the run beside it:
    it loads every core on purpose, or bounds a duration that the other workers' load
    on two cores would stretch (tests/README.md). The others share a lock it takes exclusively;
    a turnstile taken first keeps new tests from starving it."""
    if not hasattr(request.config, "workerinput"):
        yield  # one process: nothing runs beside any test
        return
    run = tmp_path_factory.getbasetemp().parent  # the run's, shared by its workers
    alone = "alone" in request.keywords
    with open(run / "alone.turnstile", "a") as turnstile, open(run / "alone.lock", "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield  # both released as the files close


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str

    @property
    def json(self) -> Any:
        return json.loads(self.stdout)


def run_agent(
    ns: str, *args: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()
) -> Result:
    cmd = ["ip", "netns", "exec", ns, *prefix, *agent_for(*args), *args]
    full_env = {**os.environ, **(env or {})}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=full_env)
    return Result(p.returncode, p.stdout, p.stderr)


@contextmanager
def listener(ns: str) -> Iterator[int]:
    """A TCP listener on 127.0.0.1 inside ns (the kernel completes handshakes from its backlog)."""
    code = (
        "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(16); "
        "print(s.getsockname()[1], flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-c", code], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()


def python_json(ns: str, *args: str, timeout: float = 120) -> Any:
    """Run this Python inside the namespace with `args`; its stdout, read as JSON."""
    out = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    ).stdout
    return json.loads(out)


@pytest.fixture
def netns() -> Iterator[Any]:
    """Factory of fresh namespaces, each deleted after the test."""
    if os.geteuid() != 0:
        pytest.fail(root_needed_line({"netns"}), pytrace=False)
    made: list[str] = []

    def make() -> str:
        name = f"ilt-{uuid.uuid4().hex[:8]}"
        lab_build.create_netns(name)
        made.append(name)
        return name

    yield make
    for name in made:
        for pidfile in Path("/tmp").glob(f"{name}*.pid"):
            pidfile.unlink(missing_ok=True)
        lab_build.delete_netns(name)


@pytest.fixture(scope="session")
def image() -> str:
    """The agent's image, built once per run (scripts/test builds it first and passes it in
    IPVS_LEFTOVERS_IMAGE); a build failure fails every test that needs it."""
    if os.geteuid() != 0:
        pytest.fail(root_needed_line({"image"}), pytrace=False)
    from tests.image.containers import image_ref

    try:
        return image_ref()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
