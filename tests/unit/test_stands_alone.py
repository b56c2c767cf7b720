"""The repository stands alone: a reader follows every reference inside it or to a public URL.

Every file git tracks is read as text. None may point at the shared folder beside the
checkout that the project was first specified in (a user who clones the project does not have
it), cite that specification by section number, name the work's own tracker (an issue
number, a work session), or hold an absolute path of the machine it was written on: the
checkout's own path, the workspace, root's or a user's home, a particular folder in /tmp
(a script's default `/tmp/ipvs-leftovers-*` and mktemp templates are not particular). Upstream references stay (`kubernetes/kubernetes#80627` is a public
pull request). What the code relies on from outside is in docs/contract.md and
docs/kube-proxy-names.md.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Written in pieces so that this file does not match itself.
FORBIDDEN = {
    "the shared folder beside the checkout": re.compile(
        r"(?:\.\./|/" + "work" + r"/)" + "shared" + r"\b"
    ),
    "a section of the outside specification": re.compile("SPEC" + r"\s*§|(?<![\w/])§\s*\d"),
    "an issue number of the project's tracker": re.compile(
        r"(?i)(?<![\w/#-])" + "issue" + r"s?\s+#?\d+"
    ),
    "a work session": re.compile(r"(?i)\b" + "session" + r"s?\s+\d+"),
    # a path starts the word: `$tmp/root/usr` and `{proc}/9/root/etc` are not root's home
    "an absolute path of this machine": re.compile(
        "|".join(
            r"(?<![\w.$}/-])/" + rest
            for rest in (
                "work/",
                "root/",
                "home" + r"/\w",
                "tmp" + r"/(?!ipvs-leftovers)(?![\w.-]*XXXXXX)[\w.-]",
            )
        )
    ),
}


def _this_checkout() -> re.Pattern[str]:
    """The checkout's own absolute path (wherever it is cloned), as written or resolved."""
    paths = {str(ROOT), str(ROOT.resolve())}
    return re.compile("|".join(r"(?<![\w.-])" + re.escape(p) + r"\b" for p in sorted(paths)))


def _tracked() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True
    ).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_nothing_tracked_points_outside_the_repository_or_at_the_tracker() -> None:
    found = []
    for path in _tracked():
        # this file's samples below are what the patterns must catch
        if path == Path(__file__).resolve() or not path.is_file() or path.is_symlink():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary: nothing a reader follows
        for what, pattern in {**FORBIDDEN, "this checkout's path": _this_checkout()}.items():
            # the whole text: a reference broken over two lines is still one
            for m in pattern.finditer(text):
                n = text.count("\n", 0, m.start()) + 1
                line = text.splitlines()[n - 1]
                found.append(f"{path.relative_to(ROOT)}:{n}: {what}: {line.strip()[:100]}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        "see ../shared/SPEC.md",
        "/" + "work/shared/kube-proxy/kube-proxy-v1.30.3-linux-amd64.xz",
        "cd /" + "work/main && make",
        "HOME=/" + "root/.cache",
        "the profile in /" + "home/alice/bench",
        "bench/run --out /" + "tmp/bench-r",
        "(e.g. bench/memprobe.sh 20000 /" + "tmp/mp d57a40d HEAD)",
        "the gate (SPEC §5)",
        "names.py's §2.1",
        "(issue 23)",
        "Issue 13.7: a CNI rule",
        "issues 6 and 15",
        "before session 22",
        "read from /proc alone** (issue\n  15): the lines",
    ],
)
def test_the_patterns_catch_what_they_are_for(line: str) -> None:
    assert any(p.search(line) for p in FORBIDDEN.values())


@pytest.mark.parametrize(
    "line",
    [
        "PR kubernetes/kubernetes#80627 (2019)",
        "issue kubernetes/kubernetes#67799",
        "docs/contract.md#the-cleanup-gate",
        "the shared collection",
        "shared with kube-proxy and the kubelet",
        'cp -a "$tmp/root/usr/bin/prometheus"',
        'f"cannot read {proc}/9/root/missing.conf"',
        "out=/" + "tmp/ipvs-leftovers-bench",
        "ctl=$(mktemp -d /" + "tmp/vm-run.XXXXXX)",
        "stage=$(mktemp -d /var/" + "tmp/ipvs-leftovers-bench.XXXXXX)",
        'Path("/' + 'tmp").glob(f"{name}*.pid")',
        "/usr/sbin/iptables-legacy-restore",
    ],
)
def test_the_patterns_leave_public_references_alone(line: str) -> None:
    assert not any(p.search(line) for p in FORBIDDEN.values())


def _anchors(doc: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings."""
    out = set()
    for line in doc.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
            out.add(slug)
    return out


def test_every_docs_reference_resolves() -> None:
    """`docs/contract.md#the-cleanup-gate` in code, tests or docs names a file and a heading
    that exist, so a reader can follow it."""
    ref = re.compile(r"\b(docs/[\w./-]+\.md)(?:#([\w-]+))?|\(([\w./-]+\.md)#([\w-]+)\)")
    missing = []
    for path in _tracked():
        if path.suffix not in {".py", ".md", ".yaml"} or not path.is_file():
            continue
        for m in ref.finditer(path.read_text(encoding="utf-8", errors="replace")):
            name, anchor = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
            doc = ROOT / name if name.startswith("docs/") else path.parent / name
            if not doc.is_file():
                missing.append(f"{path.relative_to(ROOT)}: {name} does not exist")
            elif anchor and anchor not in _anchors(doc):
                missing.append(f"{path.relative_to(ROOT)}: {name} has no heading #{anchor}")
    assert not missing, "\n".join(sorted(set(missing)))
