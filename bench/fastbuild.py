"""The lab's node state, rendered and applied fast enough for 20,000 Services.

Same texts, same tools, same order as lab.build.build; two differences, both about speed:

* render: lab.state.FamilyState dedups with `x not in list` (quadratic) and lab.render recomputes
  family_state per text. `fast_render()` swaps in set-backed dedup and a per-node memo while it
  runs. `check_equal(n)` proves the texts are byte-identical to lab.render's at size n.
* nft: one `nft -f` of kube-proxy's table is super-linear in the kernel at this size (every
  goto/jump rule). The same script lines go in as four transactions: declarations, rules of
  regular chains, set/map elements, rules of base chains. Same objects; only handles differ.

`python -m bench.fastbuild OUT SIZE...` writes OUT/<size>/{ipset,iptables,ipbatch,ipvsadm,nft-*}.txt
(after check_equal at 300 Services).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from lab import build as lab_build
from lab import nft as lab_nft
from lab import render, state
from lab.model import Node
from lab.scenarios import scaled_node

PARTS = ("ipset", "iptables", "iptables-rebuild", "ipbatch", "ipvsadm") + tuple(
    f"nft-{i}" for i in range(4)
)


def bench_node(n: int) -> Node:
    return scaled_node(n, with_ipvs=True, nftables_table=True, backend="nft")


@contextlib.contextmanager
def fast_render() -> Iterator[None]:
    cls = state.FamilyState
    orig_add, orig_bind, orig_fs = cls.add, cls.bind, render.family_state
    memo: dict[tuple[int, str], state.FamilyState] = {}

    def add(self: state.FamilyState, set_base: str, entry: str) -> None:
        seen = self.__dict__.setdefault("_seen", {}).setdefault(set_base, set())
        if entry not in seen:
            seen.add(entry)
            self.entries[set_base].append(entry)

    def bind(self: state.FamilyState, address: str) -> None:
        bound = self.__dict__.setdefault("_bound", set())
        if address not in bound:
            bound.add(address)
            self.bound.append(address)
            self.add(state.n.IPVS_IPS, address)

    def family_state(node: Node, family: str) -> state.FamilyState:
        key = (id(node), family)
        if key not in memo:
            memo[key] = orig_fs(node, family)  # type: ignore[arg-type]
        return memo[key]

    cls.add, cls.bind = add, bind  # type: ignore[method-assign]
    render.family_state = family_state  # type: ignore[assignment]
    try:
        yield
    finally:
        cls.add, cls.bind = orig_add, orig_bind  # type: ignore[method-assign]
        render.family_state = orig_fs


def _texts(node: Node) -> dict[str, str]:
    nft_lines = render.nft_script(node).splitlines()
    base = {c[0] for c in lab_nft.BASE_CHAINS}
    rules = [x for x in nft_lines if x.startswith("add rule ")]
    in_base = [x for x in rules if x.split()[4] in base]
    regular = [x for x in rules if x.split()[4] not in base]
    decl = [x for x in nft_lines if not x.startswith(("add rule ", "add element "))]
    elems = [x for x in nft_lines if x.startswith("add element ")]
    assert len(decl) + len(regular) + len(in_base) + len(elems) == len(nft_lines)
    # After a cleanup only the ipvs-mode objects come back: the kubelet's rules in built-in
    # chains are still there and `-I` would add them twice, so rebuild without them.
    rebuild = render.iptables_restore(dataclasses.replace(node, kubelet=False), "ipv4")
    out = {
        "ipset": render.ipset_restore(node),
        "iptables": "".join(render.iptables_restore(node, "ipv4").values()),
        "iptables-rebuild": "".join(rebuild.values()),
        "ipbatch": render.ip_batch(node),
        "ipvsadm": render.ipvsadm_restore(node),
    }
    for i, part in enumerate((decl, regular, elems, in_base)):
        out[f"nft-{i}"] = "".join(f"{x}\n" for x in part)
    return out


def texts(node: Node) -> dict[str, str]:
    with fast_render():
        return _texts(node)


def check_equal(n: int) -> None:
    """The fast path's texts are byte-identical to lab.render's (nft: same lines, same order
    within each transaction)."""
    node = bench_node(n)
    slow = _texts(node)
    fast = texts(bench_node(n))
    if slow != fast:
        bad = [k for k in slow if slow[k] != fast[k]]
        raise SystemExit(f"fastbuild: fast render differs from lab.render at n={n}: {bad}")
    joined = "".join(fast[f"nft-{i}"] for i in range(4)).splitlines()
    if sorted(joined) != sorted(render.nft_script(node).splitlines()):
        raise SystemExit("fastbuild: nft transactions do not hold the lab's script lines")


def write(out: Path, n: int) -> float:
    start = time.perf_counter()
    t = texts(bench_node(n))
    d = out / str(n)
    d.mkdir(parents=True, exist_ok=True)
    for name, text in t.items():
        (d / f"{name}.txt").write_text(text)
    return time.perf_counter() - start


def load(render_dir: Path | None, n: int) -> dict[str, str]:
    if render_dir is not None and (render_dir / str(n) / "nft-3.txt").exists():
        return {p: (render_dir / str(n) / f"{p}.txt").read_text() for p in PARTS}
    return texts(bench_node(n))


def apply(netns: str, node: Node, t: dict[str, str], backend: str = "nft") -> dict[str, float]:
    """lab.build.build's sequence with pre-rendered texts; seconds per step. The iptables text
    goes to `backend`'s iptables-restore (the texts do not depend on it)."""
    run, in_ns = lab_build.run, lab_build.in_ns
    took: dict[str, float] = {}

    def step(name: str, fn) -> None:  # type: ignore[no-untyped-def]
        s = time.perf_counter()
        fn()
        took[name] = took.get(name, 0.0) + time.perf_counter() - s

    step(
        "link+sysctls", lambda: (lab_build._node_link(netns, node), lab_build._sysctls(netns, node))
    )
    step("ipset", lambda: run(in_ns(netns, "ipset", "restore", "-exist"), t["ipset"]))
    step(
        "iptables",
        lambda: run(
            in_ns(netns, f"iptables-{backend}-restore", "-w", "10", "--noflush"), t["iptables"]
        ),
    )
    step("ip-batch", lambda: run(["ip", "-n", netns, "-batch", "-"], t["ipbatch"]))
    if node.with_ipvs:
        step("routes", lambda: lab_build._real_server_routes(netns, node))
    if t["ipvsadm"]:
        step("ipvsadm", lambda: run(in_ns(netns, "ipvsadm", "-R"), t["ipvsadm"]))
    for i in range(4):
        step("nft", lambda i=i: run(in_ns(netns, "nft", "-f", "-"), t[f"nft-{i}"]))
    return took


def rebuild_leftovers(netns: str, t: dict[str, str]) -> float:
    """Put back what a cleanup removed (sets, ipvs-mode chains and jumps, kube-ipvs0, IPVS)."""
    run, in_ns = lab_build.run, lab_build.in_ns
    s = time.perf_counter()
    run(in_ns(netns, "ipset", "restore", "-exist"), t["ipset"])
    run(in_ns(netns, "iptables-nft-restore", "-w", "10", "--noflush"), t["iptables-rebuild"])
    run(["ip", "-n", netns, "-batch", "-"], t["ipbatch"])
    run(in_ns(netns, "ipvsadm", "-R"), t["ipvsadm"])
    return time.perf_counter() - s


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    check_equal(300)
    print("fastbuild: fast render identical to lab.render at n=300")
    for n in (int(x) for x in argv[1:]):
        print(f"fastbuild: rendered n={n} in {write(out, n):.1f}s (host)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
