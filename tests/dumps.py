"""Full dumps of a namespace's netfilter, IPVS and link state, in the operators' formats, and
the "before minus exactly the ipvs-mode leftovers" view, computed without the agent's code."""

from __future__ import annotations

import re
import shlex
import subprocess

from lab import names as n
from tests.oracle import IPVS_CHAINS, JUMP_COMMENTS, is_iptables_mode_chain

SAVES = ("iptables-legacy-save", "ip6tables-legacy-save", "iptables-nft-save", "ip6tables-nft-save")


def _in(ns: str, *cmd: str, check: bool = True) -> str:
    p = subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{cmd}: {p.stderr}")
    return p.stdout


def _clean_save(text: str) -> list[str]:
    return [
        re.sub(r"\[\d+:\d+\]$", "[0:0]", line)
        for line in text.splitlines()
        if line and not line.startswith("#")
    ]


def dump(ns: str, ipvs: bool = False) -> dict[str, list[str]]:
    """Everything, one sorted list of lines per source (ipset members in hash order sorted)."""
    out: dict[str, list[str]] = {}
    for tool in SAVES:
        out[tool] = _clean_save(_in(ns, tool))
    out["ipset"] = sorted(_in(ns, "ipset", "save").splitlines())
    tables = [line.split()[1:] for line in _in(ns, "nft", "list", "tables").splitlines()]
    for fam, name in tables:
        if (fam, name) in {(f, t) for f in ("ip", "ip6") for t in ("nat", "filter", "mangle")}:
            continue  # iptables-nft's tables: compared through iptables-nft-save above
        out[f"nft {fam} {name}"] = _in(ns, "nft", "list", "table", fam, name).splitlines()
    if ipvs:
        out["ipvsadm"] = _in(ns, "ipvsadm", "-S", "-n").splitlines()
    out["links"] = sorted(
        re.sub(r"^\d+: ", "", line)
        for line in _in(ns, "ip", "-o", "link").splitlines()
        if "kube-ipvs0" not in line
    )
    out["addresses"] = sorted(
        # DAD's "tentative" flag on IPv6 addresses clears by itself a moment after setup
        re.sub(r"^\d+: ", "", line).split(" valid_lft")[0].replace(" tentative", "")
        for line in _in(ns, "ip", "-o", "addr").splitlines()
        if "kube-ipvs0" not in line
    )
    out["kube-ipvs0"] = _in(ns, "ip", "-o", "addr", "show", "dev", "kube-ipvs0", check=False).split(
        "\n"
    )
    return out


def _kube_proxy_chain(table: str, chain: str) -> bool:
    """kube-proxy's chain of either mode (cleanup removes both)."""
    return chain in IPVS_CHAINS.get(table, set()) or is_iptables_mode_chain(table, chain)


def _is_ipvs_line(table: str, line: str) -> bool:
    if line.startswith(":"):
        return _kube_proxy_chain(table, line[1:].split()[0])
    if line.startswith("-A "):
        words = shlex.split(line)
        if _kube_proxy_chain(table, words[1]):
            return True
        if "--comment" in words and words[words.index("--comment") + 1] in JUMP_COMMENTS:
            return "-j" in words and _kube_proxy_chain(table, words[words.index("-j") + 1])
    return False


def minus_leftovers(
    before: dict[str, list[str]],
    kept_chains: set[str] = frozenset(),
    kept_sets: set[str] = frozenset(),
) -> dict[str, list[str]]:
    """`before` without kube-proxy's ipvs-mode objects (except the named kept ones)."""
    expected = dict(before)
    for tool in SAVES:
        table, lines = "", []
        for line in before[tool]:
            if line.startswith("*"):
                table = line[1:]
            words = line.split()
            chain = (
                words[0][1:]
                if line.startswith(":")
                else words[1]
                if line.startswith("-A ") and len(words) > 1
                else ""
            )
            target = words[words.index("-j") + 1] if "-j" in words else ""
            # a kept chain keeps its rules, and jumps into it from outside kube-proxy's chains
            keep = chain in kept_chains or (
                target in kept_chains and not _kube_proxy_chain(table, chain)
            )
            if keep or not _is_ipvs_line(table, line):
                lines.append(line)
        expected[tool] = lines
    ipvs_sets = {n.set_name(s.name, fam) for s in n.SETS + n.OLD_SETS for fam in ("ipv4", "ipv6")}
    ipvs_sets |= {s.name for s in n.PRE_KUBE6_SETS}
    expected["ipset"] = [
        line
        for line in before["ipset"]
        if line.split()[1] not in ipvs_sets or line.split()[1] in kept_sets
    ]
    expected["kube-ipvs0"] = [""]
    return expected
