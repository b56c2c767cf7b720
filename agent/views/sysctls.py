"""The sysctls ipvs mode set, attributed (docs/contract.md#sysctls): for each one the agent
reads, whether it holds the value kube-proxy's ipvs mode sets, which of its settings that is,
and what happens to it now. Pure: a Kernel and /configz in, notes out."""

from __future__ import annotations

from dataclasses import dataclass

from agent import names
from agent.snapshot import Kernel, KubeProxyConfigz

SOURCE = "pkg/proxy/ipvs/proxier.go NewProxier"


@dataclass(frozen=True)
class SysctlNote:
    name: str
    value: str
    by_ipvs_mode: bool  # holds the value ipvs mode sets, where the kernel's default differs
    note: str


def _after(name: str, strict_arp: bool | None) -> str:
    """What becomes of a value ipvs mode set, now that nftables mode runs."""
    if name.startswith("net.ipv4.vs."):
        return "left alone: it exists only while ip_vs is loaded and goes with the module"
    if name == "net.ipv4.ip_forward":
        return (
            "kept: pods may need it, and nothing in kube-proxy's nftables mode sets it again "
            "after a reboot; make it persistent in the node's own configuration"
        )
    said = "" if strict_arp is None else f"; /configz ipvs.strictARP is {str(strict_arp).lower()}"
    return f"kept: changed only with cleanup --reset-arp-sysctls{said}"


def attribute(kernel: Kernel, configz: KubeProxyConfigz | None = None) -> list[SysctlNote]:
    """Every sysctl read, sorted by name, with what set it."""
    strict = configz.strict_arp if configz else None
    out = []
    for name, value in sorted(kernel.sysctls.items()):
        known = names.IPVS_MODE_SYSCTLS.get(name)
        if known is None:
            out.append(SysctlNote(name, value, False, "not a sysctl kube-proxy sets"))
            continue
        sets, default, constant = known
        if value == sets and value != default:
            note = f"the value ipvs mode sets ({constant}, {SOURCE}); {_after(name, strict)}"
            out.append(SysctlNote(name, value, True, note))
        else:
            out.append(
                SysctlNote(
                    name, value, False, f"not ipvs mode's value (it sets {sets}; {constant})"
                )
            )
    return out
