"""Run the built image the way a manifest runs it: flags derived from the manifest itself.

The DaemonSet and the cleanup Job are parsed, not copied: their securityContext, hostPath and
emptyDir volumes and args become podman flags, so a change to a manifest changes what these
tests run. A node's network is a lab namespace (`--network ns:/run/netns/NAME`, the pod's
hostNetwork); hostPaths are folders under a per-test "host root", never this machine's.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import REPO, Result

# Measured on Debian 12's podman 4.3 here: crun refuses the hybrid cgroup layout (runc works),
# and raising rlimits above the machine's is refused, so lower ones are passed.
PODMAN = ["podman", "--runtime", "runc"]
LIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
DAEMONSET = REPO / "daemonset" / "daemonset.yaml"
CLEANUP_JOB = REPO / "daemonset" / "cleanup-job.yaml"


def image_ref() -> str:
    """The image scripts/test built for this run, else build it now (once per session)."""
    ref = os.environ.get("IPVS_LEFTOVERS_IMAGE", "").strip()
    if ref:
        return ref
    p = subprocess.run(
        [str(REPO / "scripts" / "build-image")], capture_output=True, text=True, timeout=1800
    )
    if p.returncode != 0 or not p.stdout.strip():
        raise RuntimeError(f"scripts/build-image failed ({p.returncode}): {p.stderr[-2000:]}")
    ref = p.stdout.strip().splitlines()[-1]
    os.environ["IPVS_LEFTOVERS_IMAGE"] = ref
    return ref


@dataclass
class PodSpec:
    """One manifest's container as podman flags (without the network) and its args: its
    securityContext, volumes and resource limits."""

    flags: list[str]
    args: list[str]
    host_paths: dict[str, Path] = field(default_factory=dict)  # mountPath -> folder here

    def without_capability(self, cap: str) -> PodSpec:
        flags = list(self.flags)
        i = flags.index(cap)
        del flags[i - 1 : i + 1]  # "--cap-add", cap
        return PodSpec(flags, self.args, self.host_paths)


def pod_spec(manifest: Path, host_root: Path) -> PodSpec:
    doc: dict[str, Any] = yaml.safe_load(manifest.read_text())
    pod = doc["spec"]["template"]["spec"]
    assert pod.get("hostNetwork") is True, f"{manifest.name}: the agent needs hostNetwork"
    (c,) = pod["containers"]
    sc = c.get("securityContext", {})
    flags = [*LIMITS, "--user", f"{sc.get('runAsUser', 0)}:0"]
    # A hostNetwork pod shares the node's UTS namespace too (the CRI runs it with the node's
    # network and UTS namespaces): its hostname is the node's, which a backup bundle records.
    flags += ["--uts", "host"]
    caps = sc.get("capabilities", {})
    flags += [f for cap in caps.get("drop", []) for f in ("--cap-drop", cap)]
    flags += [f for cap in caps.get("add", []) for f in ("--cap-add", cap)]
    if sc.get("readOnlyRootFilesystem"):
        # podman's --read-only alone mounts tmpfs on /run, /tmp and /var/tmp; Kubernetes'
        # readOnlyRootFilesystem does not: only the pod's own volumes are writable.
        flags += ["--read-only", "--read-only-tmpfs=false"]
    if sc.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    assert not sc.get("privileged"), f"{manifest.name}: must not be privileged"
    limits = c.get("resources", {}).get("limits", {})
    if "memory" in limits:
        flags += ["--memory", _bytes(limits["memory"])]
    if "cpu" in limits:
        cpu = str(limits["cpu"])
        flags += ["--cpus", str(int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu))]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    host_paths: dict[str, Path] = {}
    for mount in c.get("volumeMounts", []):
        vol, target = volumes[mount["name"]], mount["mountPath"]
        if "emptyDir" in vol:
            flags += ["--tmpfs", target]
        elif "hostPath" in vol:
            hp = vol["hostPath"]
            local = host_root / hp["path"].lstrip("/")
            if hp.get("type") == "FileOrCreate":
                local.parent.mkdir(parents=True, exist_ok=True)
                local.touch()
            else:
                local.mkdir(parents=True, exist_ok=True)
            flags += ["-v", f"{local}:{target}"]
            host_paths[target] = local
        else:
            raise AssertionError(f"{manifest.name}: volume kind of {mount['name']} not modelled")
    return PodSpec(flags, list(c.get("args", [])), host_paths)


def _bytes(quantity: str) -> str:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return str(int(quantity[: -len(suffix)]) * factor)
    return quantity


def run(image: str, ns: str, spec: PodSpec, *args: str, timeout: float = 300) -> Result:
    """One container run to completion in the namespace's network (the node's)."""
    cmd = [*PODMAN, "run", "--rm", *spec.flags, "--network", f"ns:/run/netns/{ns}", image, *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return Result(p.returncode, p.stdout, p.stderr)


@contextmanager
def detached(image: str, ns: str, spec: PodSpec, *args: str, port: int = 9437) -> Iterator[str]:
    """A container left running (serve); yields its name once `port` accepts in `ns`."""
    name = f"ilt-{uuid.uuid4().hex[:8]}"
    cmd = [*PODMAN, "run", "-d", "--name", name, *spec.flags]
    cmd += ["--network", f"ns:/run/netns/{ns}", image, *args]
    subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=120)
    try:
        wait_listening(ns, port, name)
        yield name
    finally:
        subprocess.run([*PODMAN, "rm", "-f", "-t", "5", name], capture_output=True, timeout=60)


def logs(name: str) -> str:
    p = subprocess.run([*PODMAN, "logs", name], capture_output=True, text=True, timeout=30)
    return p.stdout + p.stderr


def wait_listening(ns: str, port: int, container: str | None = None, timeout: float = 60) -> None:
    probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), 1)"
    deadline = time.monotonic() + timeout
    while True:
        p = subprocess.run(
            ["ip", "netns", "exec", ns, "python3", "-c", probe], capture_output=True, timeout=30
        )
        if p.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"nothing listens on {ns} 127.0.0.1:{port}: {logs(container) if container else ''}"
            )
        time.sleep(0.3)
