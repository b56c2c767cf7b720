"""What the classifier says about a node: owner classes, findings, the classification.

The vocabulary the views, the plan and the cleanup read (docs/contract.md#ownership); the rules
that decide it are in agent.classify.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Generic, Literal, TypeVar

from agent.gate import Mode
from agent.snapshot import Ipset, IptChain, IptRule, IptTable, IpvsService, Link, NftTable


class Owner(StrEnum):
    IPVS_LEFTOVER = "ipvs-leftover"
    NFTABLES_MODE = "nftables-mode"
    KUBELET = "kubelet"
    FOREIGN = "foreign"
    UNKNOWN_KUBE = "unknown-kube"
    # created by kube-proxy's iptables mode on a node that ran it before or between
    # (docs/contract.md#ownership)
    IPTABLES_LEFTOVER = "iptables-leftover"


@dataclass(frozen=True)
class ChainRef:
    """A chain with the table it is in."""

    table: IptTable
    chain: IptChain


@dataclass(frozen=True)
class RuleRef:
    """A rule with the table it is in."""

    table: IptTable
    rule: IptRule


# What a finding is about, by its kind: one type each.
Kind = Literal["ipvs-service", "ipset", "chain", "jump-rule", "link", "nft-table"]
S = TypeVar("S", IpvsService, Ipset, ChainRef, RuleRef, Link, NftTable)


@dataclass(frozen=True, slots=True)
class Finding(Generic[S]):
    """One object seen on the node, in one ownership class, with the evidence."""

    owner: Owner
    source: str  # the reader that saw it
    kind: Kind
    name: str  # how an operator names it
    evidence: tuple[str, ...]
    obj: S = field(compare=False, repr=False)


AnyFinding = (
    Finding[IpvsService]
    | Finding[Ipset]
    | Finding[ChainRef]
    | Finding[RuleRef]
    | Finding[Link]
    | Finding[NftTable]
)


@dataclass(frozen=True, slots=True)
class Reference:
    """A rule that names a KUBE-* chain (its jump target) or KUBE-* sets (its matches): what
    the plan and precheck ask when they look for state that still uses kube-proxy's objects."""

    table: IptTable
    chain: str  # the chain the rule is in
    owner: Owner | None  # that chain's owner; None for a built-in chain
    rule: IptRule


@dataclass(frozen=True)
class Classification:
    """Every finding, the mode, whether ipvs-mode leftovers are stale, and every rule that
    references a KUBE-* chain or set (in the order of the tables, chains and rules read)."""

    findings: tuple[AnyFinding, ...]
    mode: Mode
    stale: bool
    references: tuple[Reference, ...] = ()

    def owned_by(self, owner: Owner, kind: Kind | None = None) -> list[AnyFinding]:
        return [f for f in self.findings if f.owner is owner and (kind is None or f.kind == kind)]

    def of(self, cls: type[S], *owners: Owner) -> list[Finding[S]]:
        """The findings about a `cls` (one kind), of these owners (of every owner when none is
        given), in reading order."""
        return [
            f for f in self.findings if isinstance(f.obj, cls) and (not owners or f.owner in owners)
        ]

    @property
    def leftovers(self) -> list[AnyFinding]:
        return self.owned_by(Owner.IPVS_LEFTOVER)

    @property
    def iptables_leftovers(self) -> list[AnyFinding]:
        return self.owned_by(Owner.IPTABLES_LEFTOVER)

    @property
    def removable(self) -> list[AnyFinding]:
        """What cleanup removes: kube-proxy's objects of both modes it left
        (docs/contract.md#ownership)."""
        return [f for f in self.findings if f.owner in KUBE_PROXY_CLASSES]


KUBE_PROXY_CLASSES = frozenset({Owner.IPVS_LEFTOVER, Owner.IPTABLES_LEFTOVER})
