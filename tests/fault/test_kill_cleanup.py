"""`cleanup --apply` killed with SIGKILL at its step boundaries, and a backup folder that
fills up, on lab nodes in namespaces on this kernel.

Sizes: 20 Services (dual-stack, nft backend, the node also ran iptables mode: 6 tables, 38
sets, 2 sysctls), 200 (IPv4, legacy backend, iptables mode too: 3 tables, 19 sets, 2 sysctls)
and 1,000 (dual-stack, nft: 4 tables, 38 sets, 2 sysctls; nftables mode's own table, which
cleanup never touches, holds the first 20). This kernel has no IPVS and no
dummy link, so the IPVS and kube-ipvs0 phases are not here (tests/vm).

Kill points, found deterministically:
- during the backup: the first, then the second save tool run after the cleanup's reading
  (today: after plan.json and the set dump are written, then after the first family's files)
  blocks until killed (a shim first on PATH counts the runs; the reading's are counted first);
- after the backup, before the re-check: the `--pause-before-execute` hook's stderr line;
- after step k: with `--step-delay` every step runs alone, and the hook `--kill-after-step k`
  (tests/agent_hooks.py) makes the cleanup SIGKILL itself right after step k's line (a kill sent on
  reading the line landed a step or two late on a loaded machine). The node is then checked
  to hold exactly the effect of steps 1..k.

After each kill: nothing not owned changed, everything removed is in the bundle the killed run
wrote, a folder that is not a complete bundle is refused by `restore` with nothing changed,
`cleanup --apply` again converges to zero leftovers with exit 0, and `restore` of the first
complete bundle gives back exactly the state before the first cleanup.

A bundle's completeness is decided in one place, `bundle_complete` (see there).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from lab import build, render
from lab.kube_proxy import start_fake_kube_proxy
from lab.model import Node, Port, Service
from lab.scenarios import realistic_node
from tests.conftest import agent_for, run_agent
from tests.dumps import _kube_proxy_chain, dump, minus_leftovers

pytestmark = [pytest.mark.fault, pytest.mark.netns]

# Both above BatchedLines' 0.25 s: every outcome line is flushed when written (tests above).
STEP_DELAY = 0.05
ARP = ("net.ipv4.conf.all.arp_ignore", "net.ipv4.conf.all.arp_announce")
SAVE_TOOLS = {
    ("nft", "ipv4"): "iptables-nft-save",
    ("nft", "ipv6"): "ip6tables-nft-save",
    ("legacy", "ipv4"): "iptables-legacy-save",
    ("legacy", "ipv6"): "ip6tables-legacy-save",
}


# --- the nodes --------------------------------------------------------------------------------


def fault_node(n: int, dual: bool, backend: str, iptables_mode: bool) -> Node:
    """realistic_node's varied Services, then ClusterIPs (every tenth a NodePort) up to n."""
    base = realistic_node(
        n_services=9,
        dual_stack=dual,
        backend=backend,
        third_party=True,
        nftables_table=True,
        old_release_orphans=True,
        strict_arp=True,
        iptables_mode=iptables_mode,
    )
    extra = []
    for i in range(n - len(base.services)):
        eps: list[str] = []
        for k in range(2):
            idx = 2 * i + k
            eps.append(f"10.244.{1 + idx // 250}.{idx % 250 + 2}")
            if dual:
                eps.append(f"fd00:10:244::1:{idx + 2:x}")
        cips = (f"10.96.{8 + i // 250}.{i % 250 + 2}",)
        if dual:
            cips += (f"fd00:10:96::8:{i + 2:x}",)
        np = 30100 + i // 10 if i % 10 == 0 else None
        extra.append(
            Service(
                f"team-{i % 4}",
                f"app-{i}",
                "NodePort" if np else "ClusterIP",
                cips,
                (Port("http", "TCP", 8080, node_port=np),),
                endpoints=tuple(eps),
            )
        )
    return replace(base, services=base.services + tuple(extra))


@dataclass(frozen=True)
class Size:
    services: int
    dual: bool
    backend: str
    iptables_mode: bool
    phases: tuple[int, int, int]  # the plan's iptables-table, destroy-ipset, reset-sysctl steps
    # Services in nftables mode's own table (None: all). That table is not the cleanup's and
    # listing it whole at 1,000 Services took 2 s of every comparison of the node's state.
    nft_services: int | None = None

    @property
    def id(self) -> str:
        fam = "dual" if self.dual else "ipv4"
        return f"{self.services}-{fam}-{self.backend}{'-iptmode' if self.iptables_mode else ''}"


SIZES = {
    20: Size(20, True, "nft", True, (6, 38, 2)),
    200: Size(200, False, "legacy", True, (3, 19, 2)),
    1000: Size(1000, True, "nft", False, (4, 38, 2), nft_services=20),
}

State = dict[str, list[str]]


def sysctls(ns: str) -> dict[str, str]:
    return {k: build.run(build.in_ns(ns, "sysctl", "-n", k)).strip() for k in ARP}


def state(ns: str) -> State:
    """dump() (every netfilter and link source, counters zeroed) and the ARP sysctls."""
    out = dump(ns)
    out["sysctls"] = [f"{k}={v}" for k, v in sysctls(ns).items()]
    return out


def foreign(s: State) -> State:
    """What is not kube-proxy's: minus_leftovers of a state, sysctls aside (owned)."""
    out = minus_leftovers({k: v for k, v in s.items() if k != "sysctls"})
    out.pop("kube-ipvs0", None)
    return out


@dataclass
class LabNode:
    size: Size
    ns: str
    before: State
    steps: list[tuple[str, str]]  # (action, target) in plan order
    dirty: bool = False


def _plan(ns: str) -> list[tuple[str, str]]:
    r = run_agent(ns, "cleanup", "--reset-arp-sysctls")
    assert r.rc == 1 and "--apply would run this plan" in r.stdout, r
    steps = [
        (m.group(2), m.group(3)) for m in re.finditer(r"^\s*(\d+)\. (\S+) (\S+)$", r.stdout, re.M)
    ]
    assert [int(m) for m in re.findall(r"^\s*(\d+)\. ", r.stdout, re.M)] == list(
        range(1, len(steps) + 1)
    )
    return steps


class Nodes:
    """One lab node per size for the module, rebuilt when a case left it changed."""

    def __init__(self, tmp: Path) -> None:
        self._tmp = tmp
        self._nodes: dict[int, LabNode] = {}
        self._kp: dict[str, Any] = {}

    def get(self, n: int) -> LabNode:
        """The node of this size as it was built: a case marks it dirty when it starts and
        clean when it ends with the node restored exactly; a dirty one is built again."""
        node = self._nodes.get(n)
        if node is not None and not node.dirty:
            node.dirty = True
            return node
        if node is not None:
            self._drop(node)
        size = SIZES[n]
        ns = f"ilt-kill-{n}-{os.urandom(3).hex()}"
        build.create_netns(ns)
        model = fault_node(n, size.dual, size.backend, size.iptables_mode)
        if size.nft_services is None:
            build.build(ns, model)
        else:
            build.build(ns, replace(model, nftables_table=False))
            small = replace(model, services=model.services[: size.nft_services], third_party=False)
            build.run(build.in_ns(ns, "nft", "-f", "-"), render.nft_script(small))
        families = ["IPv4", "IPv6"] if size.dual else ["IPv4"]
        kp_state = {"mode": "nftables", "families": families, "last_sync_age": 2.0}
        kp = start_fake_kube_proxy(ns, kp_state, self._tmp / f"kp-{ns}.json")
        kp.__enter__()
        self._kp[ns] = kp
        node = LabNode(size, ns, state(ns), _plan(ns))
        # the phases CASES' kill points were chosen for
        phases = [a for a, _ in node.steps]
        assert phases == (
            ["iptables-table"] * size.phases[0]
            + ["destroy-ipset"] * size.phases[1]
            + ["reset-sysctl"] * size.phases[2]
        ), phases
        assert sysctls(ns) == {ARP[0]: "1", ARP[1]: "2"}
        self._nodes[n] = node
        node.dirty = True
        return node

    def _drop(self, node: LabNode) -> None:
        kp = self._kp.pop(node.ns, None)
        if kp is not None:
            kp.__exit__(None, None, None)
        build.delete_netns(node.ns)

    def close(self) -> None:
        for node in self._nodes.values():
            self._drop(node)


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    if os.geteuid() != 0:
        pytest.fail("the fault tier needs root and network namespaces")
    made = Nodes(tmp_path_factory.mktemp("kill-nodes"))
    try:
        yield made
    finally:
        made.close()


# --- bundles: the one place that knows what a complete bundle is ------------------------------

MANIFEST = "manifest.json"


def agent_writes_manifests() -> bool:
    """Whether this agent writes manifest.json. Until it does, a bundle is
    judged by the files its plan implies; once it does, only a valid manifest makes a bundle
    complete, and this switch and `_complete_without_manifest` can go."""
    import agent.cleanup.backup as backup

    return MANIFEST in Path(backup.__file__).read_text()


def _manifest_files(doc: Any) -> dict[str, str]:
    """name -> SHA-256 from a manifest: {"files": {name: sha}} or {"files": [{name|path,
    sha256}]} (adapt here to the manifest's final shape)."""
    files = doc.get("files") if isinstance(doc, dict) else None
    if isinstance(files, dict):
        return {
            str(k): str(v.get("sha256") if isinstance(v, dict) else v) for k, v in files.items()
        }
    if isinstance(files, list):
        return {str(f.get("name") or f.get("path")): str(f.get("sha256")) for f in files}
    return {}


def _complete_with_manifest(folder: Path) -> bool:
    try:
        listed = _manifest_files(json.loads((folder / MANIFEST).read_text()))
    except (OSError, ValueError):
        return False
    present = {p.name for p in folder.iterdir() if p.name != MANIFEST}
    if not listed or set(listed) != present:
        return False
    return all(
        hashlib.sha256((folder / name).read_bytes()).hexdigest() == sha
        for name, sha in listed.items()
    )


def _complete_without_manifest(folder: Path) -> bool:
    """Today's bundles: plan.json whole, and every file its steps imply there and whole."""
    try:
        plan = json.loads((folder / "plan.json").read_text())
    except (OSError, ValueError):
        return False
    for step in plan.get("steps", []):
        action, target = step["action"], step["target"]
        if action == "iptables-table":
            backend, family, table = target.split("/")
            text = _read(folder / f"iptables-{backend}-{family}.restore")
            if f"*{table}\n" not in text or not text.endswith("COMMIT\n"):
                return False
            if not _read(folder / f"iptables-{backend}-{family}.save").endswith("\n"):
                return False
        elif action == "destroy-ipset":
            if not re.search(rf"^create {re.escape(target)} ", _read(folder / "ipset.save"), re.M):
                return False
        elif action == "reset-sysctl":
            try:
                if target not in json.loads(_read(folder / "sysctls.json")):
                    return False
            except ValueError:
                return False
    return True


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def bundle_complete(folder: Path) -> bool:
    if agent_writes_manifests():
        return _complete_with_manifest(folder)
    return _complete_without_manifest(folder)


@dataclass
class Bundle:
    """A bundle's contents as lines, per what it re-creates."""

    path: Path
    iptables: dict[tuple[str, str, str], set[str]]  # (backend, family, table) -> lines
    ipset: set[str]
    sysctls: dict[str, str]


def read_bundle(folder: Path) -> Bundle:
    """The lines a bundle re-creates: `:CHAIN`, `-A CHAIN rule` (an `-I CHAIN pos rule` as its
    `-A` twin), `ipset save` lines, sysctl values."""
    tables: dict[tuple[str, str, str], set[str]] = {}
    for path in folder.glob("iptables-*-*.restore"):
        _, backend, family = path.stem.split("-")
        table = ""
        for line in path.read_text().splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":"):
                tables.setdefault((backend, family, table), set()).add(line.split()[0])
            elif line.startswith(("-A ", "-I ")):
                words = line.split(" ", 3)
                if line.startswith("-I "):
                    line = f"-A {words[1]} {words[3]}"
                tables.setdefault((backend, family, table), set()).add(line)
    ipset = set(_read(folder / "ipset.save").splitlines())
    raw = _read(folder / "sysctls.json")
    return Bundle(
        folder, tables, ipset, {str(k): str(v) for k, v in json.loads(raw or "{}").items()}
    )


def folders(backups: Path) -> list[Path]:
    """Every folder the runs left in the backup folder, hidden ones included."""
    return sorted(p for p in backups.iterdir() if p.is_dir()) if backups.exists() else []


# --- what the node holds ----------------------------------------------------------------------


def _tables(s: State) -> dict[tuple[str, str, str], list[str]]:
    """(backend, family, table) -> its lines, from the dump's save outputs."""
    out: dict[tuple[str, str, str], list[str]] = {}
    for (backend, family), tool in SAVE_TOOLS.items():
        table = ""
        for line in s[tool]:
            if line.startswith("*"):
                table = line[1:]
            out.setdefault((backend, family, table), []).append(line)
    return out


def kube_chains(lines: list[str], table: str) -> set[str]:
    return {
        line.split()[0][1:]
        for line in lines
        if line.startswith(":") and _kube_proxy_chain(table, line.split()[0][1:])
    }


def set_names(s: State) -> set[str]:
    return {line.split()[1] for line in s["ipset"] if line.startswith("create ")}


def assert_steps_done(node: LabNode, s: State, k: int) -> None:
    """The node holds exactly the effect of plan steps 1..k: a kill that came late (or a step
    that ran early) fails here."""
    tables = _tables(s)
    sets = set_names(s)
    values = dict(line.split("=", 1) for line in s["sysctls"])
    before = dict(line.split("=", 1) for line in node.before["sysctls"])
    wrong = []
    for i, (action, target) in enumerate(node.steps, 1):
        done = i <= k
        if action == "iptables-table":
            backend, family, table = target.split("/")
            present = bool(kube_chains(tables.get((backend, family, table), []), table))
            if present == done:
                wrong.append(f"step {i} {target}: kube-proxy chains {'left' if done else 'gone'}")
        elif action == "destroy-ipset":
            if (target in sets) == done:
                wrong.append(f"step {i} set {target} {'left' if done else 'gone'}")
        elif action == "reset-sysctl":
            if (values[target] == ("0" if done else before[target])) is False:
                wrong.append(f"step {i} {target}={values[target]}")
        else:
            wrong.append(f"step {i}: {action} not expected on this kernel")
    assert not wrong, f"not exactly {k} steps applied: {wrong}"


def removed_lines(before: State, after: State) -> dict[str, set[str]]:
    """What the kill took away: chain declarations and rules per table, set lines, sysctls."""
    out: dict[str, set[str]] = {}
    tb, ta = _tables(before), _tables(after)
    for key, lines in tb.items():
        gone = set(lines) - set(ta.get(key, []))
        gone = {line.split()[0] if line.startswith(":") else line for line in gone}
        if gone:
            out["/".join(key)] = gone
    out["ipset"] = set(before["ipset"]) - set(after["ipset"])
    out["sysctls"] = set(before["sysctls"]) - set(after["sysctls"])
    return out


def assert_removed_is_in(bundle: Bundle, removed: dict[str, set[str]]) -> None:
    missing: list[str] = []
    for key, lines in removed.items():
        if key == "ipset":
            missing += [f"ipset: {line}" for line in lines - bundle.ipset]
        elif key == "sysctls":
            missing += [
                f"sysctl {line}"
                for line in lines
                if bundle.sysctls.get(line.split("=")[0]) != line.split("=", 1)[1]
            ]
        else:
            backend, family, table = key.split("/")
            have = bundle.iptables.get((backend, family, table), set())
            missing += [f"{key}: {line}" for line in lines - have]
    assert not missing, f"removed but in no bundle file ({len(missing)}): {missing[:10]}"


# --- running and killing ----------------------------------------------------------------------


def _cmd(ns: str, backups: Path, lock: Path, *extra: str) -> list[str]:
    return [
        "ip", "netns", "exec", ns, *agent_for(*extra), "cleanup", "--apply", "--reset-arp-sysctls",
        "--backup-dir", str(backups), "--lock-file", str(lock), *extra,
    ]  # fmt: skip


def _shim(folder: Path, block_at: int) -> dict[str, str]:
    """Save tools first on PATH that count their runs and block from the `block_at`-th on
    (the agent's tools get PATH from the agent: agent.readers.tools)."""
    folder.mkdir(exist_ok=True)
    runs, blocked = folder / "runs", folder / "blocked"
    runs.write_text("")
    for tool in SAVE_TOOLS.values():
        real = build.run(["sh", "-c", f"PATH=/usr/sbin:/sbin:$PATH command -v {tool}"]).strip()
        (folder / tool).write_text(
            "#!/bin/sh\n"
            f"echo {tool} >> {runs}\n"
            f'if [ "$(wc -l < {runs})" -ge {block_at} ]; then touch {blocked}; exec sleep 600; fi\n'
            f'exec {real} "$@"\n'
        )
        (folder / tool).chmod(0o755)
    return {"PATH": f"{folder}:{os.environ['PATH']}"}


def backup_shim(folder: Path, ns: str, n: int) -> dict[str, str]:
    """A shim that blocks the n-th save tool run after the cleanup's reading: one in the
    backup. The reading's runs are counted first, by a plan-only cleanup (the same one
    reading), so the kill point does not depend on how the bundle's files are laid out."""
    env = _shim(folder, 10**6)
    r = run_agent(ns, "cleanup", "--reset-arp-sysctls", env=env)
    assert r.rc == 1, r
    reads = len((folder / "runs").read_text().splitlines())
    assert reads >= 1, "the reading ran no save tool"
    return _shim(folder, reads + n)


@dataclass
class Killed:
    stdout: str
    stderr: str
    rc: int | None


def _children(pid: int) -> list[int]:
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return []
    kids: list[int] = []
    for task in tasks:
        try:
            kids += [int(k) for k in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
    return kids


def _kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL to the cleanup, then to what it started (a blocked shim: the agent runs its
    tools in their own process groups, so they are found by parent, not by group)."""
    for kill, pid in [(os.kill, p) for p in (proc.pid, *_children(proc.pid))] + [
        (os.killpg, proc.pid)
    ]:
        with contextlib.suppress(ProcessLookupError):
            kill(pid, signal.SIGKILL)


def run_until(
    cmd: list[str], env: dict[str, str], point: Callable[[subprocess.Popen[str]], bool]
) -> Killed:
    """Start the cleanup; `point` returns True when it has reached the kill point (False: it
    ended before). SIGKILL then; a watchdog kills it after 120 s whatever happens."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **env}, start_new_session=True,
    )  # fmt: skip
    watchdog = threading.Timer(120, _kill, (proc,))
    watchdog.start()
    try:
        reached = point(proc)
        _kill(proc)
        out, err = proc.communicate(timeout=60)
    finally:
        watchdog.cancel()
    assert reached, f"ended before its kill point (rc {proc.returncode}):\n{out}\n{err}"
    return Killed(out, err, proc.returncode)


def after_line(k: int) -> Callable[[subprocess.Popen[str]], bool]:
    def point(proc: subprocess.Popen[str]) -> bool:
        assert proc.stdout is not None
        seen = 0
        for line in proc.stdout:
            if re.match(r"^(done|gone|kept|failed) ", line):
                seen += 1
                if seen == k:
                    return True
        return False

    return point


def self_killed_after_line(k: int) -> Callable[[subprocess.Popen[str]], bool]:
    """The run's k-th step line came, and then the run died of SIGKILL."""
    seen = after_line(k)

    def point(proc: subprocess.Popen[str]) -> bool:
        return seen(proc) and proc.wait(timeout=60) == -signal.SIGKILL

    return point


def at_recheck(proc: subprocess.Popen[str]) -> bool:
    assert proc.stderr is not None
    return any(line.strip() == "re-checking the gate" for line in proc.stderr)


def when_blocked(marker: Path) -> Callable[[subprocess.Popen[str]], bool]:
    def point(proc: subprocess.Popen[str]) -> bool:
        end = time.monotonic() + 90
        while time.monotonic() < end and proc.poll() is None:
            if marker.exists():
                return True
            time.sleep(0.01)
        return False

    return point


# --- the cases --------------------------------------------------------------------------------

# (size, point): "backup-N" blocks the backup's N-th save tool run; "recheck" is after the
# backup; an int k is after step k (the last step's number: at the end, before the re-audit).
# Phases on this kernel: iptables tables, then sets, then the two ARP sysctls. Each size has
# the kills before the first change; the boundaries between and inside phases are spread over
# the sizes (the delay makes a kill after step k cost k * 0.3 s).
CASES = [
    # 20: 6 tables (1-6), 38 sets (7-44), 2 sysctls (45-46)
    (20, "backup-1"), (20, "backup-2"), (20, "recheck"),
    (20, 1), (20, 3), (20, 6), (20, 7),
    # 200: 3 tables (1-3), 19 sets (4-22), 2 sysctls (23-24)
    (200, "backup-1"), (200, "recheck"),
    (200, 2), (200, 3), (200, 4), (200, 13), (200, 22), (200, 23), (200, 24),
    # 1,000: 4 tables (1-4), 38 sets (5-42), 2 sysctls (43-44)
    (1000, "backup-1"), (1000, "backup-2"), (1000, "recheck"),
    (1000, 4), (1000, 5),
]  # fmt: skip


@pytest.mark.parametrize(
    ("n", "point"),
    CASES,
    ids=[f"{SIZES[n].id}-{p if isinstance(p, str) else f'step{p}'}" for n, p in CASES],
)
def test_killed_cleanup(nodes: Nodes, tmp_path: Path, n: int, point: str | int) -> None:
    node = nodes.get(n)
    ns, before = node.ns, node.before
    backups, lock = tmp_path / "backups", tmp_path / "cleanup.lock"
    env: dict[str, str] = {}
    extra: tuple[str, ...] = ()
    if isinstance(point, int):
        assert 1 <= point <= len(node.steps), node.steps
        # the cleanup kills itself with SIGKILL right after step k's line: exactly at the
        # boundary, where a kill sent on reading the line could land a step or two late on a
        # loaded machine
        extra = ("--step-delay", str(STEP_DELAY), "--kill-after-step", str(point))
        how = self_killed_after_line(point)
    elif point == "recheck":
        extra = ("--pause-before-execute", "60")
        how = at_recheck
    else:
        env = backup_shim(tmp_path / "shim", ns, int(point.split("-")[1]))
        how = when_blocked(tmp_path / "shim" / "blocked")
    killed = run_until(_cmd(ns, backups, lock, *extra), env, how)
    time.sleep(0.1)
    middle = state(ns)

    # 1. nothing not owned changed; exactly the steps reported ran
    assert foreign(middle) == foreign(before)
    k = point if isinstance(point, int) else 0
    if k:
        assert_steps_done(node, middle, k)
    else:
        assert middle == before, "changed before the first step"

    # 2. everything removed so far is in the bundle the killed run wrote, and it is complete
    left = folders(backups)
    complete = [f for f in left if bundle_complete(f)]
    if point != "backup-1" and point != "backup-2":
        assert len(complete) == 1, (left, killed)
        assert_removed_is_in(read_bundle(complete[0]), removed_lines(before, middle))
    else:  # (if a backup ever runs fewer save tools, this kill lands after it: move it)
        assert complete == [], f"a killed backup left a complete-looking bundle: {left}"

    # 3. a folder that is not a complete bundle is refused by restore, nothing changed
    for folder in left:
        if folder in complete:
            continue
        r = run_agent(ns, "restore", "--lock-file", str(lock), str(folder))
        assert r.rc == 4, f"restore accepted the partial backup {sorted(os.listdir(folder))}: {r}"
        assert state(ns) == middle

    # 4. cleanup again converges: zero leftovers, exit 0
    again = run_agent(ns, "cleanup", "--apply", "--reset-arp-sysctls", "--backup-dir",
                      str(backups), "--lock-file", str(lock))  # fmt: skip
    assert again.rc == 0, again
    assert "after: 0 ipvs-mode objects remain, 0 iptables-mode objects remain" in again.stdout or (
        "nothing to remove" in again.stdout
    ), again.stdout
    clean = state(ns)
    expected = minus_leftovers({k: v for k, v in before.items() if k != "sysctls"})
    assert {k: v for k, v in clean.items() if k != "sysctls"} == expected
    assert sysctls(ns) == {ARP[0]: "0", ARP[1]: "0"}

    # 5. restore of the first complete bundle gives back exactly the state before
    first = complete[0] if complete else None
    if first is None:
        (first,) = [f for f in folders(backups) if bundle_complete(f)]
    r = run_agent(ns, "restore", "--lock-file", str(lock), str(first))
    assert r.rc == 0, r
    assert state(ns) == before, f"restore of {first.name} after a kill at {point} is not exact"
    node.dirty = False


# --- disk full --------------------------------------------------------------------------------

# Sizes of the tmpfs mounted as --backup-dir, in KiB: on the 200-Service node (today's
# layout) they fill up in plan.json, ipset.save, the iptables dump and the .restore file; the
# last one holds the whole bundle.
TMPFS_KIB = (4, 64, 128, 512, 8192)
_FULL = (
    'b="$0" c="$1"; mount -t tmpfs -o size="$2",mode=0700 fault-full "$b" || exit 97; shift 2; '
    '"$@"; rc=$?; cp -a "$b"/. "$c"/; exit $rc'
)


def test_disk_full_during_the_backup(nodes: Nodes, tmp_path: Path) -> None:
    """A --backup-dir that fills up (a tmpfs of a few KiB in a private mount namespace; never
    this machine's disk): exit 4, nothing changed, and what is left is no complete bundle and
    is refused by restore. The tmpfs grows until the bundle fits; that run's bundle restores
    the node exactly."""
    node = nodes.get(200)
    ns, before = node.ns, node.before
    lock = tmp_path / "cleanup.lock"
    failures = []
    for kib in TMPFS_KIB:
        backups, copy = tmp_path / f"b-{kib}", tmp_path / f"copy-{kib}"
        backups.mkdir()
        copy.mkdir()
        prefix = ("unshare", "-m", "--propagation", "private", "sh", "-c", _FULL, str(backups),
                  str(copy), f"{kib}k")  # fmt: skip
        r = run_agent(ns, "cleanup", "--apply", "--reset-arp-sysctls", "--backup-dir",
                      str(backups), "--lock-file", str(lock), prefix=prefix)  # fmt: skip
        assert r.rc in (0, 4), r
        left = folders(copy)
        if r.rc == 0:
            break
        failures.append(kib)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "No space left on device" in lines[0], r.stderr
        assert lines[0].endswith("nothing was changed"), lines[0]
        assert state(ns) == before, f"changed with a full backup folder ({kib} KiB)"
        assert [f for f in left if bundle_complete(f)] == [], f"{kib} KiB: {left}"
        for folder in left:
            rr = run_agent(ns, "restore", "--lock-file", str(lock), str(folder))
            assert rr.rc == 4, (
                f"{kib} KiB: restore accepted {sorted(os.listdir(folder))} after disk full: {rr}"
            )
            assert state(ns) == before
    else:
        pytest.fail(f"the bundle did not fit in {TMPFS_KIB[-1]} KiB")
    assert len(failures) >= 3, failures  # filled at several files, not only the first
    (bundle,) = [f for f in left if bundle_complete(f)]
    rr = run_agent(ns, "restore", "--lock-file", str(lock), str(bundle))
    assert rr.rc == 0, rr
    assert state(ns) == before
    node.dirty = False
