"""The images the cluster tier's node runs, as OCI archives an operator would load into
containerd: the agent's (scripts/build-image) and the pod sandbox's (`pause`, built by
scripts/build-upstream from the Kubernetes module's build/pause/linux/pause.c). Host side:
podman runs here, never in the VM.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from tests.control_plane import KUBERNETES_VERSION
from tests.upstream import REPO, upstream_binary

PODMAN = (
    "podman",
    "--runtime",
    "runc",
)  # as scripts/build-image runs it (crun refuses hybrid cgroups)
# The sandbox image containerd's CRI is configured with (tests/cluster/node.py): a name of the
# lab's own, not registry.k8s.io's, since its bytes are built here.
PAUSE_REF = f"localhost/ipvs-leftovers-pause:{KUBERNETES_VERSION}"


def _run(args: list[str], timeout: float) -> str:
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {p.returncode}: {p.stderr.strip()[-2000:]}")
    return p.stdout.strip()


def oci_archive(ref: str, dest: Path) -> Path:
    """The image `ref` of the local podman store as an OCI archive at `dest`: the one place the
    archive is made (scripts/build-image may come to write it itself)."""
    dest.unlink(missing_ok=True)
    _run([*PODMAN, "save", "--format", "oci-archive", "-o", str(dest), ref], timeout=600)
    return dest


def agent_image() -> str:
    """The agent's image, built (or found current) by scripts/build-image; its reference."""
    return _run([str(REPO / "scripts" / "build-image")], timeout=3600).splitlines()[-1]


def pause_image() -> str:
    """An image of one file, the project-built `pause`, as the sandbox image; its reference."""
    pause = upstream_binary("pause", KUBERNETES_VERSION)
    with tempfile.TemporaryDirectory() as d:
        ctx = Path(d)
        (ctx / "pause").write_bytes(pause.read_bytes())
        (ctx / "pause").chmod(0o755)
        (ctx / "Containerfile").write_text(
            'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n'
        )
        _run([*PODMAN, "build", "-q", "-t", PAUSE_REF, str(ctx)], timeout=300)
    return PAUSE_REF
