"""Run inside a test namespace: a fake API server, real kube-proxy in nftables mode until it has
synced, and, while it runs, `ipvs-leftovers audit --json` and `precheck --json`; prints
`{"audit": ..., "precheck": ...}`. Needs tests/fake_apiserver.py.

python -m tests.audit_beside_kube_proxy BINARY LOGFILE [KUBE-PROXY FLAG ...]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.fake_apiserver import Cluster, FakeAPIServer
from tests.realkp.node import base_flags
from tests.run_kube_proxy import NODE, SERVICES

AGENT = str(Path(sys.executable).with_name("ipvs-leftovers"))


def _agent(*args: str) -> object:
    p = subprocess.run([AGENT, *args], capture_output=True, text=True, timeout=120)
    return json.loads(p.stdout) if p.stdout.strip() else {"rc": p.returncode, "err": p.stderr}


def main() -> None:
    binary, logfile, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
    with FakeAPIServer(Cluster(NODE, SERVICES)) as api, tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        kubeconfig.write_text(api.kubeconfig())
        args = [binary, *base_flags(kubeconfig, "node-a", "nftables", "10.244.0.0/16"), *flags]
        with open(logfile, "w") as log:
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
            try:
                deadline = time.monotonic() + 60
                while "SyncProxyRules complete" not in Path(logfile).read_text():
                    if time.monotonic() > deadline:
                        sys.exit(f"kube-proxy did not sync within 60s; see {logfile}")
                    time.sleep(0.5)
                time.sleep(2)  # the other family's proxier
                out = {"audit": _agent("audit", "--json"), "precheck": _agent("precheck", "--json")}
            finally:
                proc.terminate()
                proc.wait(10)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
