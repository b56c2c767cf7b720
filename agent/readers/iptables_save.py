"""Parser for `iptables-save` output, the one format both iptables backends print, and the
one tokenizer of its lines: the reader and restore's bundle checker both split with `split`.
"""

from __future__ import annotations

from typing import NamedTuple

from agent.snapshot import Backend, Family, IptChain, IptRule, IptTable

# iptables-restore's argument buffer (xshared.c `struct xt_param_buf`): a longer word is an error.
MAX_WORD = 1023
_BLANKS = " \t\n"


# getopt_long takes any unambiguous start of a long option: `--ju LOG` is `--jump LOG`.
JUMPS = frozenset(
    {"-j", "-g"} | {full[:n] for full in ("--jump", "--goto") for n in range(3, len(full) + 1)}
)


class IptablesSaveError(ValueError):
    """The text is not iptables-save output."""


class Words(NamedTuple):
    words: tuple[str, ...]
    odd: str | None  # why iptables-save never writes this line; None when it could have


def split(line: str) -> Words:
    """A line's words exactly as iptables-restore reads them (iptables/xshared.c
    `add_param_to_argv`; tests check it against this machine's 1.8.9, both backends): only
    double quotes quote, and inside them a backslash
    takes the next character as it is; a single quote and a backslash outside them are plain
    characters (iptables-save writes interface and set names raw: `-i cni'0`, `-i ext\\`).
    A closing quote ends its word, an empty one included.

    Never raises. What iptables-restore takes silently but iptables-save never writes (a quote
    left open, a word glued after a closing quote, a word too long) is named in `odd`, for a
    reader of untrusted lines to refuse."""
    words: list[str] = []
    word: list[str] = []
    quoted = escaped = False
    odd = None
    for i, ch in enumerate(line):
        if escaped:
            word.append(ch)
            escaped = False
        elif quoted and ch == "\\":
            escaped = True
        elif ch == '"' and quoted:
            quoted = False
            words.append("".join(word))
            word = []
            if line[i + 1 : i + 2] not in ("", *_BLANKS):
                odd = odd or f"a word right after a closing quote at column {i + 2}"
        elif ch == '"':
            quoted = True
        elif ch in _BLANKS and not quoted:
            if word:
                words.append("".join(word))
                word = []
        else:
            word.append(ch)
    if quoted:
        odd = odd or "a double quote never closed"
    if word:
        words.append("".join(word))
    if any(len(w) > MAX_WORD for w in words):
        odd = odd or f"a word longer than iptables-restore takes ({MAX_WORD} characters)"
    return Words(tuple(words), odd)


def parse_rule(chain: str, text: str) -> IptRule:
    """One rule, given the text after `-A CHAIN `, read as iptables-restore reads it."""
    words = split(text).words
    target = comment = None
    sets: list[str] = []
    for i, word in enumerate(words[:-1]):
        nxt = words[i + 1]
        if word in JUMPS:
            target = nxt
        elif word == "--comment" and comment is None:
            comment = nxt
        elif word == "--match-set":
            sets.append(nxt)
    return IptRule(chain=chain, text=text, target=target, comment=comment, match_sets=tuple(sets))


def checked_rule(head: tuple[str, ...], text: str) -> IptRule:
    """The rule of the line `HEAD TEXT` of an untrusted file (a restore bundle: `-A CHAIN` or
    `-I CHAIN POS` and the rule); IptablesSaveError unless iptables-restore reads the line
    exactly as parse_rule reads it, as iptables-save could have written it."""
    whole = split(" ".join((*head, text)))
    if whole.odd:
        raise IptablesSaveError(f"{whole.odd}, which iptables-save never writes")
    words = split(text).words
    if whole.words != (*head, *words):
        raise IptablesSaveError(f"iptables-restore would not read {head[1]!r} as written")
    if sum(w in JUMPS for w in words) > 1:  # iptables refuses it; a reader might take either
        raise IptablesSaveError("more than one -j or -g")
    return parse_rule(head[1], text)


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
