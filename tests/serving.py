"""Run `ipvs-leftovers serve` inside a test namespace and scrape it from there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.conftest import AGENT, REPO

SCRAPE = str(REPO / "tests" / "scrape.py")


def scrape(ns: str, url: str, n: int = 1, insecure: bool = False) -> dict[str, Any]:
    cmd = ["ip", "netns", "exec", ns, sys.executable, SCRAPE, url, str(n)]
    out = subprocess.run(
        cmd + (["--insecure"] if insecure else []),
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    return json.loads(out)


@contextmanager
def serving(
    ns: str,
    *args: str,
    port: int = 9437,
    env: dict[str, str] | None = None,
    scheme: str = "http",
    nofile: tuple[int, int] | None = None,
) -> Iterator[subprocess.Popen[str]]:
    """serve in `ns`; with `nofile`, under that (soft, hard) RLIMIT_NOFILE."""
    limit = ["prlimit", f"--nofile={nofile[0]}:{nofile[1]}"] if nofile else []
    cmd = ["ip", "netns", "exec", ns, *limit, AGENT, "serve", "--listen", f"127.0.0.1:{port}"]
    cmd += args
    proc = subprocess.Popen(
        cmd, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            probe = subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    sys.executable,
                    "-c",
                    f"import socket; socket.create_connection(('127.0.0.1', {port}), 1)",
                ],
                capture_output=True,
            )
            if probe.returncode == 0:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"serve did not start: {proc.stderr.read() if proc.stderr else ''}"
                )
            time.sleep(0.2)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def metrics_view(samples: dict[str, float]) -> dict[str, Any]:
    """The scrape in the shape of audit --json's leftovers, to compare the two."""
    p = "ipvs_leftovers_"
    chains: dict[tuple[str, str, str], float] = {}
    rules: dict[tuple[str, str, str], float] = {}
    for key, value in samples.items():
        for name, into in ((f"{p}iptables_chains{{", chains), (f"{p}iptables_rules{{", rules)):
            if key.startswith(name):
                labels = dict(kv.split("=") for kv in key[len(name) : -1].split(","))
                into[tuple(labels[k].strip('"') for k in ("backend", "family", "table"))] = value
    return {
        "stale": samples[f"{p}stale"] == 1,
        "present": samples[f"{p}kube_ipvs0_present"] == 1,
        "addresses": {
            f: samples[f'{p}kube_ipvs0_addresses{{family="{f}"}}'] for f in ("ipv4", "ipv6")
        },
        "vs": samples[f'{p}ipvs_virtual_servers{{class="kube-proxy"}}'],
        "rs": samples[f'{p}ipvs_real_servers{{class="kube-proxy"}}'],
        "foreign_vs": samples[f'{p}ipvs_virtual_servers{{class="foreign"}}'],
        "foreign_rs": samples[f'{p}ipvs_real_servers{{class="foreign"}}'],
        "ipsets": {f: samples[f'{p}ipsets{{family="{f}"}}'] for f in ("ipv4", "ipv6")},
        "entries": {f: samples[f'{p}ipset_entries{{family="{f}"}}'] for f in ("ipv4", "ipv6")},
        "chains": chains,
        "rules": rules,
        "confirmed": samples[f"{p}nftables_mode_confirmed"] == 1,
    }


def audit_view(doc: dict[str, Any]) -> dict[str, Any]:
    left = doc["leftovers"]
    chains: dict[tuple[str, str, str], float] = {}
    rules: dict[tuple[str, str, str], float] = {}
    for c in left["iptables_chains"]:
        key = (c["backend"], c["family"], c["table"])
        chains[key] = chains.get(key, 0) + 1
        rules[key] = rules.get(key, 0) + c["rules"]
    for f in doc["findings"]:
        if f["class"] == "ipvs-leftover" and f["kind"] == "jump-rule":
            backend, family, table = f["name"].split(" ", 1)[0].split("/")
            rules[(backend, family, table)] = rules.get((backend, family, table), 0) + 1
    return {
        "stale": doc["stale"],
        "present": left["kube_ipvs0"]["present"],
        "addresses": left["kube_ipvs0"]["addresses"],
        "vs": left["ipvs_virtual_servers"],
        "rs": left["ipvs_real_servers"],
        "foreign_vs": doc["foreign"]["ipvs_virtual_servers"],
        "foreign_rs": doc["foreign"]["ipvs_real_servers"],
        "ipsets": left["ipsets"],
        "entries": left["ipset_entries"],
        "chains": chains,
        "rules": rules,
        "confirmed": doc["mode"]["nftables_confirmed"],
    }


def broken_tool_dir(tmp: Path, tool: str, body: str) -> str:
    """A PATH entry whose `tool` misbehaves, to break one source on purpose."""
    d = tmp / "broken-bin"
    d.mkdir(exist_ok=True)
    script = d / tool
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return f"{d}:{os.environ.get('PATH', '')}"
