"""Mutated bundles through restore's checker (every bundle file format): whatever the checker
accepts is only what kube-proxy could have made and the plan says was removed; everything else
is a BundleError, never another exception, never a hang.

The seeds are a whole valid bundle (tests/unit/test_restore_check.py's), one of whose files is
mutated per example (the same mutations as the parsers' fuzzing: cuts, duplicates, inserted
tokens, swapped lines, changed digits). The property is checked on the accepted plan itself.
"""

from __future__ import annotations

import ipaddress

from hypothesis import given
from hypothesis import strategies as st

from agent.classify import KUBE_PROXY_CLASSES, Owner, chain_owner
from agent.cleanup.bundle import BundleError
from agent.cleanup.restore_check import STANDARD_TARGETS, RestorePlan, check
from agent.names import ARP_SYSCTLS, IPVS_SETS, KUBE_IPVS0
from agent.readers.iptables_save import parse_rule
from agent.snapshot import BUILTIN_CHAINS
from tests.fault.test_fuzz_parsers import FUZZ, mutated, outcome
from tests.unit.test_restore_check import files

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
