"""A node's state read through the standard CLIs, and what a kube-proxy mode created in it.

Provenance, not name lists: what a mode created is `objects(after) - objects(before)` around a
real kube-proxy run in that mode. Everything here parses the tools' own output (ipvsadm -S -n,
ipset save, iptables-save per backend and family, nft -s list ruleset, ip -d link / ip addr), never
the agent's readers.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from tests.realkp.node import IPVSADM_SAVE, NodeNet, ns_run

BUILTIN = {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"}
BACKENDS = ("legacy", "nft")
FAMILIES = ("ipv4", "ipv6")
PROTO = {"-t": "TCP", "-u": "UDP", "--sctp-service": "SCTP"}


@dataclass
class State:
    """One reading of a node. Texts are normalised only where the kernel's own order or
    counters change without anyone changing the state."""

    ipvs: dict[str, list[str]] = field(default_factory=dict)  # service name -> sorted "-a" lines
    ipvs_lines: dict[str, str] = field(default_factory=dict)  # service name -> its "-A" line
    ipsets: dict[str, list[str]] = field(default_factory=dict)  # set name -> create + sorted adds
    # "backend/family/table" -> chain -> rules (in order); built-in chains' policy dropped
    iptables: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    nft_tables: dict[str, str] = field(default_factory=dict)  # "family name" -> nft -s list table
    links: dict[str, str] = field(default_factory=dict)  # link name -> "ip -d -o link" (no stats)
    addrs: dict[str, list[str]] = field(default_factory=dict)  # link name -> sorted addresses
    ip_forward: str = ""

    def objects(self) -> set[str]:
        """Every object, named the way the agent's findings name them where it has one."""
        out: set[str] = set()
        out |= {f"ipvs {name}" for name in self.ipvs}
        out |= {f"ipset {name}" for name in self.ipsets}
        for where, chains in self.iptables.items():
            for chain, rules in chains.items():
                if chain in BUILTIN:
                    out |= {f"rule {where} {chain} {r}" for r in rules}
                else:
                    out.add(f"chain {where} {chain}")
        out |= {f"nft {t}" for t in self.nft_tables}
        out |= {f"link {name}" for name in self.links}
        for link, addrs in self.addrs.items():
            out |= {f"addr {link} {a}" for a in addrs}
        return out


def _ipvs_name(words: list[str]) -> str:
    if words[1] == "-f":
        fam = "IPv6" if "-6" in words else "IPv4"
        return f"FWM {words[2]} {fam}"
    return f"{PROTO[words[1]]} {words[2]}"


def read_ipvs(ns: str) -> tuple[dict[str, list[str]], dict[str, str]]:
    return parse_ipvs(ns_run(ns, "sh", "-c", IPVSADM_SAVE, check=False))


def parse_ipvs(text: str) -> tuple[dict[str, list[str]], dict[str, str]]:
    services: dict[str, list[str]] = {}
    lines: dict[str, str] = {}
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        name = _ipvs_name(words)
        if words[0] == "-A":
            services.setdefault(name, [])
            lines[name] = line
        elif words[0] == "-a":
            services.setdefault(name, []).append(line)
    return {k: sorted(v) for k, v in services.items()}, lines


_INITVAL = re.compile(r" initval 0x[0-9a-f]+")


def read_ipsets(ns: str) -> dict[str, list[str]]:
    return parse_ipsets(ns_run(ns, "ipset", "save"))


def parse_ipsets(text: str) -> dict[str, list[str]]:
    sets: dict[str, list[str]] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) > 1 and words[0] in ("create", "add"):
            # initval is the hash's random seed, chosen anew by every create
            sets.setdefault(words[1], []).append(_INITVAL.sub("", line))
    return {k: [v[0], *sorted(v[1:])] for k, v in sets.items()}


_COUNTERS = re.compile(r"\[\d+:\d+\]")


def _save_tool(backend: str, family: str) -> str:
    return f"{'ip6tables' if family == 'ipv6' else 'iptables'}-{backend}-save"


def read_iptables(ns: str) -> dict[str, dict[str, list[str]]]:
    texts = {(b, f): ns_run(ns, _save_tool(b, f), check=False) for b in BACKENDS for f in FAMILIES}
    return parse_iptables(texts)


def parse_iptables(texts: dict[tuple[str, str], str]) -> dict[str, dict[str, list[str]]]:
    out: dict[str, dict[str, list[str]]] = {}
    for backend in BACKENDS:
        for family in FAMILIES:
            table = ""
            for line in texts.get((backend, family), "").splitlines():
                if line.startswith("*"):
                    table = line[1:]
                    out.setdefault(f"{backend}/{family}/{table}", {})
                elif line.startswith(":"):
                    chain = line[1:].split()[0]
                    out[f"{backend}/{family}/{table}"].setdefault(chain, [])
                elif line.startswith("-A "):
                    chain, _, rule = line[3:].partition(" ")
                    out[f"{backend}/{family}/{table}"].setdefault(chain, []).append(
                        _COUNTERS.sub("", rule)
                    )
    return out


def read_nft(ns: str) -> dict[str, str]:
    tables: dict[str, str] = {}
    for line in ns_run(ns, "nft", "list", "tables").splitlines():
        _, family, name = line.split()
        tables[f"{family} {name}"] = ns_run(ns, "nft", "-s", "list", "table", family, name)
    return tables


_STATS = re.compile(r"\b(RX|TX):.*$", re.S)


def parse_links(link_text: str, addr_text: str) -> tuple[dict[str, str], dict[str, list[str]]]:
    links: dict[str, str] = {}
    for line in link_text.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        links[name] = line
    addrs: dict[str, list[str]] = {}
    for line in addr_text.splitlines():
        words = line.split()
        addrs.setdefault(words[1], []).append(f"{words[2]} {words[3]}")
    return links, {k: sorted(v) for k, v in addrs.items()}


_SCRIPT = "; ".join(
    [
        f"echo @@ipvs; {IPVSADM_SAVE}",
        "echo @@ipset; ipset save",
        *(f"echo @@{b}/{f}; {_save_tool(b, f)} 2>/dev/null" for b in BACKENDS for f in FAMILIES),
        "echo @@nft; nft -s list ruleset",
        "echo @@link; ip -d -o link show",
        "echo @@addr; ip -o addr show",
        "echo @@fwd; sysctl -n net.ipv4.ip_forward",
    ]
)


def read(net: NodeNet) -> State:
    """One shell in the namespace runs every tool (process starts are dear under TCG)."""
    parts: dict[str, list[str]] = {}
    current = ""
    for line in ns_run(net.ns, "sh", "-c", _SCRIPT).splitlines():
        if line.startswith("@@"):
            current = line[2:]
            parts[current] = []
        else:
            parts[current].append(line)
    text = {k: "\n".join(v) + "\n" for k, v in parts.items()}
    ipvs, lines = parse_ipvs(text["ipvs"])
    links, addrs = parse_links(text["link"], text["addr"])
    return State(
        ipvs=ipvs,
        ipvs_lines=lines,
        ipsets=parse_ipsets(text["ipset"]),
        iptables=parse_iptables({(b, f): text[f"{b}/{f}"] for b in BACKENDS for f in FAMILIES}),
        nft_tables=parse_ruleset(text["nft"]),
        links=links,
        addrs=addrs,
        ip_forward=text["fwd"].strip(),
    )


def parse_ruleset(text: str) -> dict[str, str]:
    """`nft -s list ruleset` split into its tables, each as `nft -s list table` prints it."""
    tables: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        if line.startswith("table "):
            _, family, name, _ = line.split()
            current = f"{family} {name}"
            tables[current] = []
        if current:
            tables[current].append(line)
    return {k: "\n".join(v) + "\n" for k, v in tables.items()}


def created(before: State, after: State) -> set[str]:
    """What a kube-proxy run added: objects after that were not there before."""
    return after.objects() - before.objects()


def rewritten(before: State, after: State) -> set[str]:
    """Chains that existed before and whose rules a kube-proxy run changed."""
    return {
        f"chain {where} {chain}"
        for where, chains in after.iptables.items()
        for chain, rules in chains.items()
        if chain not in BUILTIN and before.iptables.get(where, {}).get(chain, rules) != rules
    }


# --- putting a mode's state back after nftables mode started (scenarios B and C) ----------------


def put_back(net: NodeNet, saved: State, made: set[str]) -> None:
    """Re-create what the mode made (`made`, from `saved`), as a node whose startup cleanup
    failed keeps it: IPVS services, kube-ipvs0 with its addresses, the sets, the iptables tables
    as they were saved (whole tables: they hold nothing kube-proxy's nftables mode writes)."""
    now = read(net)
    # Every IPVS service of the saved state that is gone: a failed cleanup flushed nothing, so
    # the keepalived-style service is back too.
    ipvs = [
        "\n".join([saved.ipvs_lines[name], *saved.ipvs[name]])
        for name in saved.ipvs
        if name not in now.ipvs
    ]
    if ipvs:
        ns_run(net.ns, "ipvsadm", "-R", stdin="\n".join(ipvs) + "\n")
    if "link kube-ipvs0" in made:
        if "kube-ipvs0" not in now.links:
            ns_run(net.ns, "ip", "link", "add", "kube-ipvs0", "type", "dummy")
        for addr in saved.addrs.get("kube-ipvs0", []):
            ns_run(net.ns, "ip", "addr", "replace", addr.split()[1], "dev", "kube-ipvs0")
    sets = ["\n".join(saved.ipsets[name]) for name in saved.ipsets if f"ipset {name}" in made]
    if sets:
        ns_run(net.ns, "ipset", "restore", "-exist", stdin="\n".join(sets) + "\n")
    wheres = {o.split()[1] for o in made if o.startswith(("chain ", "rule "))}
    for where in sorted(wheres):
        backend, family, table = where.split("/")
        tool = f"{'ip6tables' if family == 'ipv6' else 'iptables'}-{backend}-restore"
        ns_run(net.ns, tool, "-w", "10", stdin=render_table(table, saved.iptables[where]))


def render_table(table: str, chains: dict[str, list[str]]) -> str:
    lines = [f"*{table}"]
    for chain in chains:
        lines.append(f":{chain} {'ACCEPT' if chain in BUILTIN else '-'} [0:0]")
    for chain, rules in chains.items():
        lines += [f"-A {chain} {r}" for r in rules]
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"


def table_of(obj: str) -> str:
    return obj.split()[1]


def rule_target(rule: str) -> str | None:
    words = shlex.split(rule)
    return words[words.index("-j") + 1] if "-j" in words else None
