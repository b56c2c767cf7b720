"""A one-shot cleanup Job pinned to one node (`ipvs-leftovers job-manifest --node NODE`)."""

from __future__ import annotations

import re

# RFC 1123 subdomain: what a node name may be.
NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
BACKUP_DIR = "/var/lib/ipvs-leftovers"
LOCK_DIR = "/run/ipvs-leftovers"

TEMPLATE = """\
# One-shot ipvs-leftovers {what} on node {node}. Rendered by:
#   ipvs-leftovers job-manifest --node {node}{apply_flag}
# Watch it with: kubectl -n {namespace} logs -f job/{name}
apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
  namespace: {namespace}
  labels:
    app.kubernetes.io/name: ipvs-leftovers
    app.kubernetes.io/component: cleanup
    ipvs-leftovers.io/node: {node}
spec:
  backoffLimit: 0
  ttlSecondsAfterFinished: 604800
  template:
    metadata:
      labels:
        app.kubernetes.io/name: ipvs-leftovers
        app.kubernetes.io/component: cleanup
    spec:
      # Pinned: the Job acts on exactly this node's network namespace.
      nodeName: {node}
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      enableServiceLinks: false
      restartPolicy: Never
      serviceAccountName: ipvs-leftovers
      automountServiceAccountToken: false
      priorityClassName: system-node-critical
      tolerations:
        - operator: Exists
      securityContext:
        seccompProfile:
          type: RuntimeDefault
      containers:
        - name: ipvs-leftovers
          image: {image}
          imagePullPolicy: IfNotPresent
          args: [{args}]
          resources:
            requests:
              cpu: 50m
              memory: 64Mi
            limits:
              cpu: "1"
              memory: 512Mi
          securityContext:
            runAsUser: 0
            runAsNonRoot: false
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities:
              drop: ["ALL"]
              add: ["NET_ADMIN", "NET_RAW"]
          volumeMounts:
            - name: backups
              mountPath: {backup_dir}
            - name: lock
              mountPath: {lock_dir}
            - name: xtables-lock
              mountPath: /run/xtables.lock
            - name: tmp
              mountPath: /tmp
      volumes:
        # Backup bundles stay on the node, next to what they restore.
        - name: backups
          hostPath:
            path: {backup_dir}
            type: DirectoryOrCreate
        # One cleanup at a time per node, shared with the DaemonSet's auto-cleanup.
        - name: lock
          hostPath:
            path: {lock_dir}
            type: DirectoryOrCreate
        # The lock kube-proxy and the kubelet take around iptables changes.
        - name: xtables-lock
          hostPath:
            path: /run/xtables.lock
            type: FileOrCreate
        - name: tmp
          emptyDir:
            medium: Memory
            sizeLimit: 16Mi
"""


def render(node: str, image: str, namespace: str = "ipvs-leftovers", apply: bool = False) -> str:
    """The Job YAML; ValueError for a name that cannot be a node's."""
    if not NODE_NAME.match(node) or len(node) > 253:
        raise ValueError(f"{node!r} is not a valid node name (RFC 1123 subdomain)")
    args = ["cleanup", "--backup-dir", BACKUP_DIR, "--lock-file", f"{LOCK_DIR}/cleanup.lock"]
    if apply:
        args.insert(1, "--apply")
    kind = "cleanup" if apply else "plan"
    name = f"ipvs-leftovers-{kind}-{node}"[:63].rstrip("-.")
    return TEMPLATE.format(
        what="cleanup" if apply else "cleanup plan (no change)",
        node=node,
        name=name,
        namespace=namespace,
        image=image,
        args=", ".join(f'"{a}"' for a in args),
        backup_dir=BACKUP_DIR,
        lock_dir=LOCK_DIR,
        apply_flag=" --apply" if apply else "",
    )
