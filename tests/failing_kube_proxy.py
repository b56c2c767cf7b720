"""Run inside a test namespace: the fake API server and real kube-proxy in nftables mode, whose
`nft` fails while a flag file exists, until told to stop. Driven by files in CONTROL:

  ready         written once kube-proxy has synced its table
  fail          while it exists, every `nft` kube-proxy runs exits 1 (the test writes it)
  add-NAME      the test asks for Service NAME (one of LATE) to be added; `added-NAME` answers
  stop          the test asks kube-proxy and the API server to end

kube-proxy v1.37.2 runs the `nft` binary it found on its PATH at start (sigs.k8s.io/knftables
nftables.go: exec.LookPath("nft"), then `nft -f -` for each transaction), so a wrapper first on
its PATH is the whole fault: the kernel and nf_tables are untouched.

python -m tests.failing_kube_proxy BINARY LOGFILE CONTROL
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.fake_apiserver import Cluster, Endpoint, FakeAPIServer, Port, Service
from tests.realkp.node import base_flags
from tests.run_kube_proxy import NODE, SERVICES

# Services the test adds while kube-proxy runs.
LATE = {
    "late": Service(
        "late", ("10.96.4.90",), (Port(80, name="http"),), endpoints=(Endpoint("10.244.0.52"),)
    ),
    "later": Service(
        "later", ("10.96.4.91",), (Port(80, name="http"),), endpoints=(Endpoint("10.244.0.53"),)
    ),
}


def wrapper(control: Path) -> Path:
    """A directory holding `nft`: the real one, unless the flag file exists."""
    real = shutil.which("nft")
    if real is None:
        sys.exit("no nft on PATH")
    bin_dir = control / "bin"
    bin_dir.mkdir(exist_ok=True)
    nft = bin_dir / "nft"
    nft.write_text(
        "#!/bin/sh\n"
        f'if [ -e "{control}/fail" ]; then echo "nft: failing on purpose (test)" >&2; exit 1; fi\n'
        f'exec "{real}" "$@"\n'
    )
    nft.chmod(0o755)
    return bin_dir


def synced(log: Path) -> bool:
    table = subprocess.run(["nft", "list", "table", "ip", "kube-proxy"], capture_output=True)
    return "SyncProxyRules complete" in log.read_text() and b"10.96.4.20" in table.stdout


def serve(api: FakeAPIServer, control: Path, proc: subprocess.Popen[bytes]) -> None:
    """Answer the test's requests until it asks to stop (or kube-proxy exits)."""
    while not (control / "stop").exists() and proc.poll() is None:
        for name, svc in LATE.items():
            if (control / f"add-{name}").exists() and not (control / f"added-{name}").exists():
                api.push("apply", svc)
                (control / f"added-{name}").write_text("")
        time.sleep(0.2)


def main() -> None:
    binary, logfile, control = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    env = {**os.environ, "PATH": f"{wrapper(control)}:{os.environ.get('PATH', '')}"}
    with FakeAPIServer(Cluster(NODE, list(SERVICES))) as api:
        kubeconfig = control / "kubeconfig"
        kubeconfig.write_text(api.kubeconfig())
        args = [binary, *base_flags(kubeconfig, "node-a", "nftables", "10.244.0.0/16")]
        with logfile.open("w") as log:
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 90
            while not synced(logfile):
                if time.monotonic() > deadline or proc.poll() is not None:
                    sys.exit(f"kube-proxy did not sync within 90s; see {logfile}")
                time.sleep(0.5)
            (control / "ready").write_text("")
            serve(api, control, proc)
        finally:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
