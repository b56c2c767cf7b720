"""A one-shot cleanup Job pinned to one node (`ipvs-leftovers job-manifest --node NODE`): data
below both the node's command and agent/fleet, which each render it.

The Job is built as an object and serialized with PyYAML: every value the user gives (node,
image, namespace) is quoted as YAML needs, never pasted into a template.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

import yaml

# RFC 1123 subdomain: what a node name may be (at most 253 characters).
NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# RFC 1123 label: what a namespace may be (at most 63 characters).
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_LABEL = 63  # a label value, and a Job's name (its pods carry it in the job-name label)
BACKUP_DIR = "/var/lib/ipvs-leftovers"
LOCK_DIR = "/run/ipvs-leftovers"
NODE_LABEL = "ipvs-leftovers.io/node"
# A hung cleanup must not hold the node's cleanup lock for ever: past this the Job controller
# kills the pod (the lock is an flock, released with the process) and marks the Job failed
# (DeadlineExceeded). Measured whole runs are seconds to a minute (bench/README.md: 17 s of
# steps at 20,000 Services under emulation); the tools' own deadlines are minutes.
ACTIVE_DEADLINE = 1800


class InvalidName(ValueError):
    """A value Kubernetes would refuse; `option` is the command-line option that gave it."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def fit(prefix: str, node: str) -> str:
    """`prefix + node` as a name or label value of at most 63 characters.

    Too long: the node's name is cut and a digest of the whole name appended, so that two long
    node names with the same beginning still give two names.
    """
    whole = prefix + node
    if len(whole) <= MAX_LABEL:
        return whole
    room = MAX_LABEL - len(prefix) - 9  # "-" and 8 hex digits
    return f"{prefix}{node[:room].rstrip('-.')}-{_digest(node)}"


def validate(node: str, namespace: str) -> None:
    if len(node) > 253 or not NODE_NAME.fullmatch(node):
        raise InvalidName(
            "--node", f"{node!r} is not a valid node name (RFC 1123 subdomain, lower case)"
        )
    if len(namespace) > MAX_LABEL or not DNS_LABEL.fullmatch(namespace):
        raise InvalidName(
            "--namespace",
            f"{namespace!r} is not a valid namespace (RFC 1123 label: at most 63 characters "
            "of a-z, 0-9 and '-')",
        )


@dataclass(frozen=True)
class Drain:
    """What the Job's cleanup does about live connections (docs/contract.md#live-connections):
    None keeps the agent's own default wait; cutting is never the default."""

    timeout: float | None = None
    cut: bool = False

    def check(self, active_deadline: int) -> None:
        if self.timeout is not None and self.timeout >= active_deadline:
            raise InvalidName(
                "--drain-timeout",
                f"{self.timeout:g}s is not shorter than the Job's --active-deadline "
                f"({active_deadline}s): Kubernetes would stop the Job while it waits",
            )

    def args(self) -> list[str]:
        out = [] if self.timeout is None else ["--drain-timeout", f"{self.timeout:g}s"]
        return out + (["--cut-connections"] if self.cut else [])


def manifest(
    node: str,
    image: str,
    namespace: str = "ipvs-leftovers",
    apply: bool = False,
    active_deadline: int = ACTIVE_DEADLINE,
    drain: Drain = Drain(),
    service_account: str = "ipvs-leftovers",
) -> dict[str, Any]:
    """The Job as an object; InvalidName for a node or namespace Kubernetes would refuse, or a
    drain timeout the Job's deadline would cut short. `service_account`: the agent's (fleet
    step takes it from the DaemonSet)."""
    validate(node, namespace)
    if not image.strip():
        raise InvalidName("--image", "the image must not be empty")
    drain.check(active_deadline)
    args = ["cleanup", "--backup-dir", BACKUP_DIR, "--lock-file", f"{LOCK_DIR}/cleanup.lock"]
    if apply:
        args[1:1] = ["--apply", *drain.args()]
    name = fit(f"ipvs-leftovers-{'cleanup' if apply else 'plan'}-", node)
    labels = {
        "app.kubernetes.io/name": "ipvs-leftovers",
        "app.kubernetes.io/component": "cleanup",
        NODE_LABEL: fit("", node),
    }
    pod_labels = {k: v for k, v in labels.items() if k != NODE_LABEL}
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if labels[NODE_LABEL] != node:  # the label was cut: the whole name goes in an annotation
        metadata["annotations"] = {NODE_LABEL: node}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": active_deadline,
            "ttlSecondsAfterFinished": 604800,
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    # Pinned: the Job acts on exactly this node's network namespace.
                    "nodeName": node,
                    "hostNetwork": True,
                    "dnsPolicy": "ClusterFirstWithHostNet",
                    "enableServiceLinks": False,
                    "restartPolicy": "Never",
                    # A stop (the deadline, `kubectl delete`) ends the step under way and undoes
                    # the cleanup: the time that takes on a large node (docs/operations.md)
                    "terminationGracePeriodSeconds": STOP_GRACE,
                    "serviceAccountName": service_account,
                    "automountServiceAccountToken": False,
                    "priorityClassName": "system-node-critical",
                    "tolerations": [{"operator": "Exists"}],
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [_container(image, args)],
                    "volumes": _volumes(),
                },
            },
        },
    }


# Seconds a stopped cleanup has to finish its step and undo, before the SIGKILL: the benchmark's
# 20,000-Service node took 102 s to clean and 183 s to restore, in an emulated VM 10-35 times
# slower than a real node (docs/operations.md#a-stop-during-a-cleanup).
STOP_GRACE = 300


def _container(image: str, args: list[str]) -> dict[str, Any]:
    return {
        "name": "ipvs-leftovers",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "args": args,
        "resources": {
            "requests": {"cpu": "50m", "memory": "64Mi"},
            "limits": {"cpu": "1", "memory": "512Mi"},
        },
        "securityContext": {
            "runAsUser": 0,
            "runAsNonRoot": False,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN", "NET_RAW"]},
        },
        "volumeMounts": [
            {"name": "backups", "mountPath": BACKUP_DIR},
            {"name": "lock", "mountPath": LOCK_DIR},
            {"name": "xtables-lock", "mountPath": "/run/xtables.lock"},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }


def _volumes() -> list[dict[str, Any]]:
    return [
        # Backup bundles stay on the node, next to what they restore.
        {"name": "backups", "hostPath": {"path": BACKUP_DIR, "type": "DirectoryOrCreate"}},
        # One cleanup at a time per node, shared with the DaemonSet's auto-cleanup.
        {"name": "lock", "hostPath": {"path": LOCK_DIR, "type": "DirectoryOrCreate"}},
        # The lock kube-proxy and the kubelet take around iptables changes.
        {
            "name": "xtables-lock",
            "hostPath": {"path": "/run/xtables.lock", "type": "FileOrCreate"},
        },
        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
    ]


def render(
    node: str,
    image: str,
    namespace: str = "ipvs-leftovers",
    apply: bool = False,
    active_deadline: int = ACTIVE_DEADLINE,
    drain: Drain = Drain(),
) -> str:
    """The Job as YAML, after a comment saying how it was made and how to watch it."""
    job = manifest(node, image, namespace, apply, active_deadline, drain)
    what = "cleanup" if apply else "cleanup plan (no change)"
    flags = " ".join(["--apply", *drain.args()]) if apply else ""
    header = (
        f"# One-shot ipvs-leftovers {what} on node {node}. Rendered by:\n"
        f"#   ipvs-leftovers job-manifest --node {node}{' ' + flags if flags else ''}\n"
        f"# Watch it with: kubectl -n {namespace} logs -f job/{job['metadata']['name']}\n"
    )
    body: str = yaml.safe_dump(job, sort_keys=False, default_flow_style=False, width=1000)
    return header + body
