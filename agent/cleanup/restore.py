"""`restore BUNDLE`: replays a backup bundle, in the reverse of the cleanup order."""

from __future__ import annotations

import json
import os
import socket
import struct
from collections.abc import Callable
from pathlib import Path

from agent.cleanup import ipvsadm_rules
from agent.readers import tools
from agent.readers.netlink import (
    NLA_F_NESTED,
    NLM_F_EXCL,
    NetlinkError,
    RtNetlink,
    attr,
    attrs,
    consistent,
)


class BundleError(ValueError):
    """The folder is not a bundle written by `cleanup --apply`."""


RTM_NEWLINK, RTM_NEWADDR = 16, 20
NLM_F_CREATE = 0x400
IFLA_IFNAME, IFLA_LINKINFO, IFLA_INFO_KIND = 3, 18, 1
IFA_ADDRESS, IFA_LOCAL = 1, 2
IFF_UP = 0x1


def _ifinfo(index: int, flags: int = 0, change: int = 0) -> bytes:
    return struct.pack("=BxHiII", 0, 0, index, flags, change)


def _new_dummy(rt: RtNetlink, name: str, kind: str, index: int) -> None:
    body = _ifinfo(index) + attr(IFLA_IFNAME, name.encode() + b"\0")
    body += attr(IFLA_LINKINFO | NLA_F_NESTED, attr(IFLA_INFO_KIND, kind.encode()))
    rt.command(RTM_NEWLINK, body, NLM_F_CREATE | NLM_F_EXCL)


def _addr_request(index: int, cidr: str) -> tuple[int, bytes, int]:
    address, prefix = cidr.split("/")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    raw = socket.inet_pton(family, address)
    body = struct.pack("=BBBBI", family, int(prefix), 0, 0, index)
    body += attr(IFA_LOCAL, raw) + attr(IFA_ADDRESS, raw)
    return (RTM_NEWADDR, body, NLM_F_CREATE | NLM_F_EXCL)


def _present(rt: RtNetlink, index: int) -> set[str]:
    found = set()
    for p in rt.addresses():
        family, prefix, _, _, at = struct.unpack_from("=BBBBI", p)
        if at != index:
            continue
        a = attrs(p, 8)
        raw = (
            a.get(IFA_LOCAL) if family == socket.AF_INET and IFA_LOCAL in a else a.get(IFA_ADDRESS)
        )
        if raw is not None:
            found.add(f"{socket.inet_ntop(family, raw)}/{prefix}")
    return found


def _link(doc: dict[str, object], say: Callable[[str], None]) -> None:
    """kube-ipvs0 back with its old index and its addresses in their old order, over rtnetlink:
    the addresses many to a send (pyroute2 took ~1 ms of Python each, and its import seconds
    under the benchmark's VM: most of a restore at 1,000 Services)."""
    name = str(doc["name"])
    kind = str(doc.get("kind") or "dummy")
    with RtNetlink() as rt:
        # whole dumps, read again if a concurrent change interrupted one (agent.readers.netlink)
        if not consistent(lambda: any(r.name == name for r in rt.link_rows())):
            try:  # the old interface index, so that the node is as it was
                _new_dummy(rt, name, kind, int(doc["index"]))  # type: ignore[call-overload]
            except (KeyError, NetlinkError) as exc:
                say(f"kube-ipvs0 gets a new interface index ({exc})")
                _new_dummy(rt, name, kind, 0)
        index = consistent(lambda: next(r.index for r in rt.link_rows() if r.name == name))
        present = consistent(lambda: _present(rt, index))
        listed = [str(c) for c in doc.get("addresses", [])]  # type: ignore[attr-defined]
        # The kernel lists IPv6 addresses newest first and IPv4 oldest first: adding them in
        # that order gives the same listing back.
        ordered = [c for c in listed if ":" not in c] + [c for c in reversed(listed) if ":" in c]
        wanted = [c for c in ordered if c not in present]
        codes = rt.commands([_addr_request(index, c) for c in wanted])
        failed = [(c, code) for c, code in zip(wanted, codes, strict=True) if code]
        if failed:
            cidr, code = failed[0]
            raise NetlinkError(code, f"adding {cidr} to {name}: {os.strerror(code)}")
        if doc.get("up"):
            rt.command(RTM_NEWLINK, _ifinfo(index, IFF_UP, IFF_UP))


def _ipvs(text: str, timeout: float) -> None:
    """Over netlink, batched (agent.cleanup.ipvsadm_rules); `ipvsadm -R` for a text with words that
    module does not know."""
    requests = ipvsadm_rules.parse(text)
    if requests is None:
        tools.run(["ipvsadm", "-R"], stdin=text, timeout=timeout)
    else:
        ipvsadm_rules.load(requests)


def restore(
    folder: Path, say: Callable[[str], None], timeout: float = tools.DEFAULT_TIMEOUT
) -> None:
    """Raises BundleError, tools.ToolError or OSError on the first step that fails."""
    if not (folder / "plan.json").is_file():
        raise BundleError(f"{folder} has no plan.json: not a bundle written by cleanup --apply")
    if (folder / "ipset.save").exists():
        tools.run(
            ["ipset", "restore", "-exist"],
            stdin=(folder / "ipset.save").read_text(),
            timeout=timeout,
        )
        say("restored ipsets")
    if (folder / "kube-ipvs0.json").exists():
        _link(json.loads((folder / "kube-ipvs0.json").read_text()), say)
        say("restored kube-ipvs0")
    for path in sorted(folder.glob("iptables-*-*.restore")):
        _, backend, family = path.stem.split("-")
        prefix = "ip6tables" if family == "ipv6" else "iptables"
        tools.run(
            [f"{prefix}-{backend}-restore", "-w", "30", "--noflush"],
            stdin=path.read_text(),
            timeout=timeout,
        )
        say(f"restored iptables {backend} {family}")
    if (folder / "ipvsadm.rules").exists():
        _ipvs((folder / "ipvsadm.rules").read_text(), timeout)
        say("restored IPVS virtual servers")
    if (folder / "sysctls.json").exists():
        for name, value in json.loads((folder / "sysctls.json").read_text()).items():
            Path("/proc/sys", *name.split(".")).write_text(f"{value}\n")
        say("restored sysctls")
