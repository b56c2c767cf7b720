#!/usr/bin/env bash
# serve's and audit's peak RSS at one size for several commits of the agent, in one VM boot.
# Usage: bench/memprobe.sh N OUT REV [REV ...]   (e.g. bench/memprobe.sh 20000 /tmp/mp d57a40d HEAD)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
n=$1 out=$2; shift 2
rm -rf "$out" && mkdir -p "$out"
agents=()
for rev in "$@"; do
    v="$out/venv-$rev"
    "$repo/.venv/bin/python" -m venv --without-pip "$v"
    site=$("$v/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    (cd "$repo" && git archive "$rev" agent) | tar -x -C "$site"
    "$repo/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$site/ipvs-leftovers-deps.pth"
    sed "1s|.*|#!$v/bin/python|" "$repo/.venv/bin/ipvs-leftovers" > "$v/bin/ipvs-leftovers"
    chmod +x "$v/bin/ipvs-leftovers"
    "$v/bin/python" -m compileall -q "$site/agent"
    agents+=("$rev=$v/bin/ipvs-leftovers")
done
"$repo/.venv/bin/python" -m bench.fastbuild "$out/render" "$n"
"$repo/scripts/vm-run" --out "$out" -- python -m bench.memprobe "$n" "$out/render" "$out" "${agents[@]}"
