"""precheck and verify (docs/precheck-verify.md): pure checks over a snapshot and its
classification.

No I/O, no clock: kube-proxy's configuration, the node-IP hints and the probe result are read by
the caller (agent/readers/kube_proxy_config.py, agent/cli/checks.py) and passed in, `now` too.
Every check says pass, warn or fail and carries the evidence that decided it. Something that
could not be read is a warn (precheck) or a fail (verify) naming what, never a pass.

common.py holds what both share; precheck.py and verify.py one command's checks each.
"""

from __future__ import annotations

from agent.views.checks.common import (
    LIST_LIMIT,
    SCHEMA,
    Check,
    Status,
    document,
    ready,
    render,
)
from agent.views.checks.precheck import (
    NodeIpHints,
    check_conntrack_invalid,
    check_foreign_ipvs,
    check_foreign_references,
    check_ipvs_scheduler,
    check_kernel,
    check_kube_proxy_mode,
    check_localhost_nodeports,
    check_mode_pinned,
    check_nodeport_addresses,
    check_strict_arp,
    foreign_references,
    precheck,
    primary_node_ips,
    readiness_metrics,
)
from agent.views.checks.verify import (
    ProbeResult,
    check_kube_ipvs0_gone,
    check_nftables_mode,
    check_nftables_sync,
    check_no_leftovers,
    check_probe,
    verify,
)

__all__ = [
    "Check",
    "LIST_LIMIT",
    "NodeIpHints",
    "ProbeResult",
    "SCHEMA",
    "Status",
    "check_conntrack_invalid",
    "check_foreign_ipvs",
    "check_foreign_references",
    "check_ipvs_scheduler",
    "check_kernel",
    "check_kube_ipvs0_gone",
    "check_kube_proxy_mode",
    "check_localhost_nodeports",
    "check_mode_pinned",
    "check_nftables_mode",
    "check_nftables_sync",
    "check_no_leftovers",
    "check_nodeport_addresses",
    "check_probe",
    "check_strict_arp",
    "document",
    "foreign_references",
    "precheck",
    "primary_node_ips",
    "readiness_metrics",
    "ready",
    "render",
    "verify",
]
