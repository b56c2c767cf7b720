"""Copy what a real-kube-proxy run recorded into tests/data/kube-proxy-<version>/.

    python -m tests.realkp.record VM_OUT/realkp NODE [VERSION]

Takes kube-proxy's endpoint answers (per mode) and the node states after ipvs mode (S1) and
iptables mode (S5) of one node; see tests/data/kube-proxy-v1.30.3/README.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"


def record(run_dir: Path, node: str, version: str = "v1.30.3") -> Path:
    out = DATA / f"kube-proxy-{version}"
    src = run_dir / node
    endpoints = json.loads((src / "endpoints.json").read_text())
    for mode, answers in endpoints.items():
        d = out / mode
        d.mkdir(parents=True, exist_ok=True)
        for name, answer in answers.items():
            ext = "txt" if name in ("proxyMode", "metrics") else "json"
            (d / f"{name}.{ext}").write_text(answer["body"])
            (d / f"{name}.status").write_text(f"{answer['status']}\n")
    states = out / "states" / node
    states.mkdir(parents=True, exist_ok=True)
    for name in ("S0", "S1", "S4", "S5"):
        f = src / f"state-{name}.json"
        if f.exists():
            (states / f.name).write_text(f.read_text())
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    print(record(Path(args[0]), args[1], *args[2:]))
