"""The README's demo: a node that ran kube-proxy in ipvs mode, then moved to nftables mode.

`python -m lab.demo` builds it in a throwaway namespace (with IPVS and a dummy kube-ipvs0 when
the kernel has them, as in the VM that scripts/demo boots), starts a stand-in kube-proxy that
answers as nftables mode does, runs `ipvs-leftovers audit` there, and removes everything.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from lab import build
from lab.kube_proxy import start_fake_kube_proxy
from lab.scenarios import realistic_node

NETNS = "ipvs-leftovers-demo"


def _has_ipvs() -> bool:
    return (
        subprocess.run(
            ["modprobe", "-a", "ip_vs", "ip_vs_rr", "ip_vs_wlc", "dummy"], capture_output=True
        ).returncode
        == 0
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--services", type=int, default=12)
    parser.add_argument("--backend", choices=["nft", "legacy"], default="nft")
    parser.add_argument("--json", action="store_true", help="show audit --json instead")
    args = parser.parse_args()

    ipvs = _has_ipvs()
    node = realistic_node(
        args.services,
        dual_stack=True,
        backend=args.backend,
        with_ipvs=ipvs,
        third_party=True,
        nftables_table=True,
        old_release_orphans=True,
        strict_arp=True,
    )
    agent = str(Path(sys.executable).with_name("ipvs-leftovers"))
    build.delete_netns(NETNS)
    build.create_netns(NETNS)
    try:
        build.build(NETNS, node)
        print(
            f"# lab node {NETNS}: {len(node.services)} Services, dual-stack, iptables-"
            f"{args.backend}, {'IPVS + dummy kube-ipvs0' if ipvs else 'no IPVS on this kernel'},"
            " keepalived/Docker/CNI state, kube-proxy now in nftables mode",
            flush=True,
        )
        with tempfile.TemporaryDirectory() as tmp:
            state = {"mode": "nftables", "families": ["IPv4", "IPv6"], "last_sync_age": 4.0}
            with start_fake_kube_proxy(NETNS, state, Path(tmp) / "kube-proxy.json"):
                cmd = ["ip", "netns", "exec", NETNS, agent, "audit"]
                print(f"$ {' '.join(cmd[4:])}" + (" --json" if args.json else ""), flush=True)
                rc = subprocess.run(cmd + (["--json"] if args.json else [])).returncode
        print(f"# exit code {rc} (1 = ipvs-mode leftovers on a node that no longer uses them)")
        return 0 if rc in (0, 1) else rc
    finally:
        build.delete_netns(NETNS)


if __name__ == "__main__":
    sys.exit(main())
