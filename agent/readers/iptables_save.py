"""Parser for `iptables-save` output, the one format both iptables backends print."""

from __future__ import annotations

import shlex

from agent.snapshot import Backend, Family, IptChain, IptRule, IptTable


class IptablesSaveError(ValueError):
    """The text is not iptables-save output."""


def parse_rule(chain: str, text: str) -> IptRule:
    """One rule, given the text after `-A CHAIN `."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise IptablesSaveError(f"cannot split rule in {chain}: {exc}: {text!r}") from exc
    target = comment = None
    sets: list[str] = []
    for i, word in enumerate(words[:-1]):
        nxt = words[i + 1]
        if word in ("-j", "--jump", "-g", "--goto"):
            target = nxt
        elif word == "--comment" and comment is None:
            comment = nxt
        elif word == "--match-set":
            sets.append(nxt)
    return IptRule(chain=chain, text=text, target=target, comment=comment, match_sets=tuple(sets))


def parse(text: str, backend: Backend, family: Family) -> tuple[IptTable, ...]:
    """Every table in one iptables-save dump, chains in the order they are declared."""
    tables: list[IptTable] = []
    table: str | None = None
    order: list[str] = []
    rules: dict[str, list[IptRule]] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("*"):
            table, order, rules = line[1:], [], {}
        elif table is None:
            raise IptablesSaveError(f"line {lineno}: {line!r} outside a table")
        elif line.startswith(":"):
            name = line[1:].split(" ", 1)[0]
            if name in rules:  # iptables-save never does; each copy would repeat the rules
                raise IptablesSaveError(f"line {lineno}: chain {name} declared twice")
            order.append(name)
            rules[name] = []
        elif line.startswith("-A "):
            chain, _, rest = line[3:].partition(" ")
            if chain not in rules:
                raise IptablesSaveError(f"line {lineno}: rule for undeclared chain {chain}")
            rules[chain].append(parse_rule(chain, rest))
        elif line == "COMMIT":
            chains = tuple(IptChain(name=n, rules=tuple(rules[n])) for n in order)
            tables.append(IptTable(backend=backend, family=family, name=table, chains=chains))
            table = None
        else:
            raise IptablesSaveError(f"line {lineno}: unexpected {line[:60]!r}")
    if table is not None:
        raise IptablesSaveError(f"table {table} has no COMMIT")
    return tuple(tables)
