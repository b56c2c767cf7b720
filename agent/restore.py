"""`restore BUNDLE`: replays a backup bundle, in the reverse of the cleanup order."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent import tools
from agent.netlink import NLM_F_DUMP_INTR, DumpInterrupted, consistent


class BundleError(ValueError):
    """The folder is not a bundle written by `cleanup --apply`."""


def _addresses(ipr: Any, index: int) -> set[str]:
    """The link's addresses; pyroute2 (0.9) ignores NLM_F_DUMP_INTR, so it is checked here."""
    found = list(ipr.get_addr(index=index))
    if any(a["header"]["flags"] & NLM_F_DUMP_INTR for a in found):
        raise DumpInterrupted()
    return {f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}" for a in found}


def _link(doc: dict[str, object], say: Callable[[str], None]) -> None:
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    name = str(doc["name"])
    with IPRoute() as ipr:
        if not ipr.link_lookup(ifname=name):
            kind = str(doc.get("kind") or "dummy")
            try:  # the old interface index, so that the node is as it was
                ipr.link("add", ifname=name, kind=kind, index=int(doc["index"]))  # type: ignore[call-overload]
            except (KeyError, NetlinkError) as exc:
                say(f"kube-ipvs0 gets a new interface index ({exc})")
                ipr.link("add", ifname=name, kind=kind)
        index = ipr.link_lookup(ifname=name)[0]
        present = consistent(lambda: _addresses(ipr, index))
        listed = [str(c) for c in doc.get("addresses", [])]  # type: ignore[attr-defined]
        # The kernel lists IPv6 addresses newest first and IPv4 oldest first: adding them in
        # that order gives the same listing back.
        ordered = [c for c in listed if ":" not in c] + [c for c in reversed(listed) if ":" in c]
        for cidr in ordered:
            if cidr not in present:
                address, prefix = str(cidr).split("/")
                ipr.addr("add", index=index, address=address, prefixlen=int(prefix))
        if doc.get("up"):
            ipr.link("set", index=index, state="up")


def restore(folder: Path, say: Callable[[str], None]) -> None:
    """Raises BundleError, tools.ToolError or OSError on the first step that fails."""
    if not (folder / "plan.json").is_file():
        raise BundleError(f"{folder} has no plan.json: not a bundle written by cleanup --apply")
    if (folder / "ipset.save").exists():
        tools.run(["ipset", "restore", "-exist"], stdin=(folder / "ipset.save").read_text())
        say("restored ipsets")
    if (folder / "kube-ipvs0.json").exists():
        _link(json.loads((folder / "kube-ipvs0.json").read_text()), say)
        say("restored kube-ipvs0")
    for path in sorted(folder.glob("iptables-*-*.restore")):
        _, backend, family = path.stem.split("-")
        prefix = "ip6tables" if family == "ipv6" else "iptables"
        tools.run([f"{prefix}-{backend}-restore", "-w", "30", "--noflush"], stdin=path.read_text())
        say(f"restored iptables {backend} {family}")
    if (folder / "ipvsadm.rules").exists():
        tools.run(["ipvsadm", "-R"], stdin=(folder / "ipvsadm.rules").read_text())
        say("restored IPVS virtual servers")
    if (folder / "sysctls.json").exists():
        for name, value in json.loads((folder / "sysctls.json").read_text()).items():
            Path("/proc/sys", *name.split(".")).write_text(f"{value}\n")
        say("restored sysctls")
