#!/usr/bin/env bash
# serve's and audit's peak RSS at one size for several commits of the agent, in one VM boot.
# Usage: bench/memprobe.sh N OUT REV [REV ...]   (e.g. bench/memprobe.sh 20000 "$(mktemp -d)" d57a40d HEAD)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
n=$1 out=$2; shift 2
rm -rf "$out" && mkdir -p "$out"
agents=()
for rev in "$@"; do
    v="$out/venv-$rev"
    mkdir -p "$out/src-$rev"
    (cd "$repo" && git archive "$rev" agent) | tar -x -C "$out/src-$rev"
    "$repo/bench/install-agent" "$v" "$out/src-$rev/agent"
    agents+=("$rev=$v/bin/ipvs-leftovers")
done
"$repo/.venv/bin/python" -m bench.fastbuild "$out/render" "$n"
"$repo/scripts/vm-run" --out "$out" -- python -m bench.memprobe "$n" "$out/render" "$out" "${agents[@]}"
