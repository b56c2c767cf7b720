"""python -m lab build NS [...] | python -m lab destroy NS"""

from __future__ import annotations

import argparse
import sys

from lab.build import LabError, build, create_netns, delete_netns
from lab.scenarios import realistic_node


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="create NS and build a realistic ipvs-mode node in it")
    b.add_argument("netns")
    b.add_argument("--dual-stack", action="store_true")
    b.add_argument("--backend", choices=("legacy", "nft"), default="nft")
    b.add_argument("--services", type=int, default=12)
    b.add_argument("--with-ipvs", action="store_true", help="IPVS + dummy kube-ipvs0 (VM only)")
    b.add_argument("--nftables-table", action="store_true")
    b.add_argument("--third-party", action="store_true")
    b.add_argument("--old-orphans", action="store_true")
    b.add_argument("--older-names", action="store_true", help="1.9-1.10 sets and jump comment")
    b.add_argument(
        "--iptables-mode",
        action="store_true",
        help="the node also ran iptables mode (after ipvs; with --no-ipvs-mode instead of it)",
    )
    b.add_argument("--no-ipvs-mode", action="store_true", help="no ipvs-mode leftovers")
    b.add_argument("--strict-arp", action="store_true")
    b.add_argument("--no-kubelet", action="store_true")
    d = sub.add_parser("destroy", help="delete NS")
    d.add_argument("netns")
    args = ap.parse_args(argv)

    try:
        if args.cmd == "destroy":
            delete_netns(args.netns)
            return 0
        node = realistic_node(
            args.services,
            args.dual_stack,
            backend=args.backend,
            with_ipvs=args.with_ipvs,
            nftables_table=args.nftables_table,
            third_party=args.third_party,
            old_release_orphans=args.old_orphans,
            older_release_names=args.older_names,
            iptables_mode=args.iptables_mode,
            ipvs_leftovers=not args.no_ipvs_mode,
            strict_arp=args.strict_arp,
            kubelet=not args.no_kubelet,
        )
        create_netns(args.netns)
        try:
            build(args.netns, node)
        except LabError:
            delete_netns(args.netns)
            raise
    except LabError as exc:
        print(f"lab: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
