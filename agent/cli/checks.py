"""`precheck` and `verify` (docs/precheck-verify.md). The checks themselves are pure
(agent.views.checks); reading kube-proxy's configuration and the probe's TCP connect are the
only I/O added here.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import sys
import time

import click

from agent.cli import common
from agent.cli.options import MAX_SYNC_AGE, Seconds
from agent.views.checks import Check, ProbeResult, document, ready, render

ENV_HOST = "KUBERNETES_SERVICE_HOST"
ENV_PORT = "KUBERNETES_SERVICE_PORT"


def parse_host_port(value: str) -> tuple[str, int]:
    """HOST:PORT or [IPv6]:PORT."""
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{value!r} is not HOST:PORT")
    if host.startswith("["):
        if not host.endswith("]"):
            raise ValueError(f"{value!r}: unbalanced [ ]")
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{value!r}: write an IPv6 address as [ADDR]:PORT")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r}: port {port!r} is not 1-65535")
    return host, int(port)


def _host_port(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        parse_host_port(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    return value


def _ips(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    out = []
    for v in value:
        try:
            out.append(str(ipaddress.ip_address(v)))
        except ValueError as exc:
            raise click.BadParameter(f"{v!r} is not an IP address") from exc
    return tuple(out)


def probe_target(probe_address: str | None) -> tuple[str | None, str]:
    """The probe target and where it came from; None with the reason when there is none."""
    if probe_address:
        return probe_address, "--probe-address"
    host = os.environ.get(ENV_HOST, "").strip()
    port = os.environ.get(ENV_PORT, "").strip()
    origin = f"{ENV_HOST}/{ENV_PORT}"
    if not host or not port:
        return None, (
            f"no probe target: {ENV_HOST}/{ENV_PORT} are not set (the agent runs outside a pod) "
            "and no --probe-address HOST:PORT was given"
        )
    return (f"[{host}]:{port}" if ":" in host else f"{host}:{port}"), origin


def probe(probe_address: str | None, timeout: float) -> ProbeResult:
    """One real TCP connection from this node to a Service, closed at once."""
    target, origin = probe_target(probe_address)
    if target is None:
        return ProbeResult(None, "", False, origin)
    try:
        host, port = parse_host_port(target)
    except ValueError as exc:
        return ProbeResult(target, origin, False, f"not a usable target: {exc}")
    start = time.perf_counter()
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except TimeoutError:
        return ProbeResult(target, origin, False, f"no answer within {timeout:g}s")
    except ConnectionRefusedError:
        return ProbeResult(target, origin, False, "connection refused")
    except OSError as exc:
        return ProbeResult(target, origin, False, f"failed: {exc.strerror or exc}")
    return ProbeResult(target, origin, True, f"connected in {time.perf_counter() - start:.3f}s")


def _emit(command: str, checks: list[Check], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(document(command, checks), indent=2, sort_keys=True))
    else:
        click.echo(render(command, checks))
    sys.exit(0 if ready(checks, warn_ok=command == "verify") else 1)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the JSON document.")
@click.option(
    "--kube-proxy-config",
    type=click.Path(dir_okay=False),
    help="kube-proxy's KubeProxyConfiguration (YAML or JSON). Without it, kube-proxy's command "
    "line and --config file are read from the process table (the pod needs hostPID: true).",
)
@click.option(
    "--node-ip",
    multiple=True,
    callback=_ips,
    help="The node's primary IP (repeat for dual-stack). Default: kube-proxy's bindAddress, "
    "else the default route's source address, else the node's only address of the family.",
)
@click.pass_context
def precheck(
    ctx: click.Context, as_json: bool, kube_proxy_config: str | None, node_ip: tuple[str, ...]
) -> None:
    """Can this node move to nftables mode, and what will change. Exit 0 ready, 1 otherwise."""
    from agent.readers import kube_proxy_config as kp_config
    from agent.views.checks import NodeIpHints
    from agent.views.checks import precheck as run_checks

    common.require_permission()
    col = common.collection(common.options(ctx))
    config = kp_config.read(kube_proxy_config)
    hints = NodeIpHints(explicit=node_ip, route_sources=kp_config.route_sources())
    checks = run_checks(col.snapshot, col.classification, config, hints)
    _emit("precheck", checks, as_json)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the JSON document.")
@MAX_SYNC_AGE
@click.option(
    "--probe-address",
    callback=_host_port,
    help="HOST:PORT of a Service to connect to. Default: the kubernetes Service from "
    f"{ENV_HOST}/{ENV_PORT}.",
)
@click.option(
    "--probe-timeout",
    type=Seconds(min=0.1, max=60),
    default=3.0,
    show_default=True,
    help="Seconds the probe's TCP connect may take.",
)
@click.pass_context
def verify(
    ctx: click.Context,
    as_json: bool,
    max_sync_age: float,
    probe_address: str | None,
    probe_timeout: float,
) -> None:
    """After the migration: clean node, working nftables data plane. Exit 0 ok, 1 otherwise."""
    from agent.cleanup.plan import make_plan
    from agent.views.checks import verify as run_checks

    common.require_permission()
    col = common.collection(common.options(ctx), max_sync_age)
    result = probe(probe_address, probe_timeout)
    kept = make_plan(col.snapshot, col.classification).kept_reasons()
    now = time.time()
    checks = run_checks(col.snapshot, col.classification, kept, result, now, max_sync_age)
    _emit("verify", checks, as_json)
