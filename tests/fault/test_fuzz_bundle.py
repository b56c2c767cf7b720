"""Mutated bundles through restore's checker (every bundle file format): whatever the checker
accepts is only what kube-proxy could have made and the plan says was removed; everything else
is a BundleError, never another exception, never a hang.

The seeds are a whole valid bundle (tests/unit/test_restore_check.py's), one of whose files is
mutated per example (the same mutations as the parsers' fuzzing: cuts, duplicates, inserted
tokens, swapped lines, changed digits). The property is checked on the accepted plan itself.

And the checker reads a rule line as iptables-restore does: rules of comments and a target,
written with every quoting (iptables-save's, a shell's single quotes and backslashes, none),
are loaded by the real iptables-restore (nft and legacy) into a throwaway namespace whenever
the checker accepts them, and what iptables-save gives back is the checker's words.
"""

from __future__ import annotations

import ipaddress
import subprocess
import uuid
from collections.abc import Callable, Iterator

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agent.classify import KUBE_PROXY_CLASSES, Owner, chain_owner
from agent.cleanup.bundle import BundleError
from agent.cleanup.restore_check import STANDARD_TARGETS, RestorePlan, check
from agent.names import ARP_SYSCTLS, IPVS_SETS, KUBE_IPVS0
from agent.readers.iptables_save import parse_rule, split
from agent.snapshot import BUILTIN_CHAINS
from tests.fault.test_fuzz_parsers import FUZZ, mutated, outcome
from tests.unit.test_restore_check import files, with_rule

NAMES = sorted(files())
SEEDS = {name: data.decode() for name, data in files().items()}


def _only_kube_proxys(plan: RestorePlan) -> None:
    for s in plan.sets:
        assert s.name in IPVS_SETS
        assert all(line.split()[1] == s.name for line in s.lines)
        assert s.lines[0].startswith("create ") and all(
            line.startswith("add ") for line in s.lines[1:]
        )
    if plan.link is not None:
        assert plan.link.name == KUBE_IPVS0
        for a in plan.link.addresses:
            iface = ipaddress.ip_interface(a)
            assert iface.network.prefixlen == iface.max_prefixlen
    for t in plan.tables:
        declared = {c for c, _ in t.chains}
        for chain, rules in t.chains:
            assert chain_owner(t.table, chain)[0] in KUBE_PROXY_CLASSES
            for text in rules:
                target = parse_rule(chain, text).target
                assert (
                    target is None
                    or target in STANDARD_TARGETS
                    or target in declared
                    or chain_owner(t.table, target)[0] is not Owner.FOREIGN
                )
        for chain, pos, text in t.jumps:
            assert chain in BUILTIN_CHAINS and pos >= 1
            target = parse_rule(chain, text).target
            assert target is not None and chain_owner(t.table, target)[0] in KUBE_PROXY_CLASSES
    for s in plan.services:
        assert all(line.split()[0] in ("-A", "-a") for line in s.lines)
    for name, value in plan.sysctls:
        assert name in ARP_SYSCTLS and value.isdigit()


@FUZZ
@given(st.sampled_from(NAMES), st.data())
def test_a_mutated_bundle_file_is_refused_or_stays_kube_proxys(
    name: str, data: st.DataObject
) -> None:
    text = data.draw(mutated([SEEDS[name]]))
    bundle = {**files(), name: text.encode("utf-8", "surrogateescape")}
    plan = outcome(lambda: check(bundle), (BundleError,))
    if plan is not None:
        _only_kube_proxys(plan)


@FUZZ
@given(st.data())
def test_extra_or_missing_files_are_refused(data: st.DataObject) -> None:
    bundle = dict(files())
    if data.draw(st.booleans()):
        del bundle[data.draw(st.sampled_from([n for n in NAMES if n != "plan.json"]))]
    else:
        extra = data.draw(st.text(min_size=1, max_size=30).filter(lambda n: n not in bundle))
        bundle[extra] = b"x\n"
    assert outcome(lambda: check(bundle), (BundleError,)) is None


# --- rule lines: the checker's words are iptables-restore's -----------------------------------

# Characters that quote, escape or split somewhere: a shell's and iptables-restore's.
COMMENT_TEXT = st.text(alphabet="ab -j'\"\\\t", max_size=10)
TARGETS = ("ACCEPT", "RETURN", "LOG", "KUBE-MARK-MASQ")


def _quoted(text: str, style: str) -> str:
    if style == "save":  # xtables_save_string: \" \\ \' inside double quotes
        return '"' + "".join("\\" + c if c in "\"\\'" else c for c in text) + '"'
    if style == "single":  # a shell's
        return "'" + text + "'"
    if style == "backslash":  # a shell's, outside quotes
        return "".join("\\" + c if c in " \t'\"\\" else c for c in text) or "''"
    return text  # raw, as iptables-save writes interface and set names


@st.composite
def rule_lines(draw: st.DrawFn) -> str:
    """`-m comment --comment C ...` with `-j T` somewhere, each comment quoted its own way."""
    parts = [
        f"-m comment --comment "
        f"{_quoted(draw(COMMENT_TEXT), draw(st.sampled_from(('save', 'single', 'backslash', 'raw'))))}"
        for _ in range(draw(st.integers(0, 3)))
    ]
    jump = draw(st.sampled_from(("-j", "--jump", "--ju")))
    parts.insert(draw(st.integers(0, len(parts))), f"{jump} {draw(st.sampled_from(TARGETS))}")
    return " ".join(parts)


@pytest.fixture(scope="module", params=["nft", "legacy"])
def loaded_by_iptables(request: pytest.FixtureRequest) -> Iterator[Callable[[str], str | None]]:
    """Load `-A KUBE-FORWARD RULE` with the real iptables-restore of one backend into a
    throwaway namespace; the rule as its iptables-save gives it back, or None when refused."""
    from lab import build

    backend = request.param

    ns = f"ilt-fzr-{uuid.uuid4().hex[:8]}"
    build.create_netns(ns)

    def load(rule: str) -> str | None:
        text = f"*filter\n:KUBE-FORWARD - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n-A KUBE-FORWARD {rule}\nCOMMIT\n"
        p = subprocess.run(
            build.in_ns(ns, f"iptables-{backend}-restore", "-w", "10", "--noflush"),
            input=text,
            capture_output=True,
            text=True,
        )
        if p.returncode != 0:
            return None
        saved = build.run(build.in_ns(ns, f"iptables-{backend}-save", "-t", "filter"))
        (line,) = [ln for ln in saved.splitlines() if ln.startswith("-A KUBE-FORWARD ")]
        return line.removeprefix("-A KUBE-FORWARD ")

    try:
        yield load
    finally:
        build.delete_netns(ns)


def _target_last(words: tuple[str, ...]) -> tuple[str, ...]:
    """iptables-save writes the matches in their order and the target after them."""
    at = max(i for i, w in enumerate(words) if w in ("-j", "--jump", "--ju"))
    return (*words[:at], *words[at + 2 :], "-j", words[at + 1])


def test_what_the_checker_accepts_iptables_restore_reads_alike(
    loaded_by_iptables: Callable[[str], str | None],
) -> None:
    @settings(FUZZ, max_examples=200)
    @given(rule_lines())
    @example("-m comment --comment 'x -j LOG -m comment --comment y' -j ACCEPT")
    @example('-m comment --comment "a\\"b\\\\c\\\'d e" -j KUBE-MARK-MASQ')
    @example('-m comment --comment "x"-j LOG -j ACCEPT')
    @example(
        "-m comment --comment 'x -j LOG -m comment --comment y'"
    )  # a LOG target between single quotes
    @example(  # row 1's words, in a kube-proxy chain
        "-s 10.9.9.9/32 -j DROP -m comment --comment x' -m comment --comment \"' "
        "-j KUBE-MARK-MASQ -m comment --comment '\" -m comment --comment 'z"
    )
    def check_one(rule: str) -> None:
        accepted = outcome(lambda: check(with_rule(rule)), (BundleError,)) is not None
        if not accepted:
            return
        saved = loaded_by_iptables(rule)
        # iptables refusing the words (a stray `'`) is no misreading: restore undoes all then
        if saved is not None:
            seen, got = parse_rule("C", rule), parse_rule("C", saved)
            assert (seen.target, seen.comment) == (got.target, got.comment), (rule, saved)
            assert split(saved).words == _target_last(split(rule).words), (rule, saved)
            loaded.append(rule)

    loaded: list[str] = []
    check_one()
    # the property held on many real loads, with single quotes and backslashes among them
    assert len(loaded) >= 40, loaded
    assert any("'" in r for r in loaded) and any("\\" in r for r in loaded), loaded
