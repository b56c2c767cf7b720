"""Cold-start cuts of the one-shot commands: what they import, and the JSON they write."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from agent.cleanup.backup import plan_document, plan_json
from agent.cleanup.plan import DeleteService, Kept, Plan
from agent.readers.kube_proxy import parse_samples
from agent.snapshot import IpvsService

SERVICE = IpvsService(4, "TCP", "10.96.0.1", 443, None, "rr", 2, 0)


def test_the_audit_path_and_its_metrics_parser_import_no_prometheus_client_or_pyroute2() -> None:
    code = (
        "import sys, agent.cli, agent.collect, agent.classify, agent.views.report, agent.cleanup.backup, "
        "agent.cleanup.procedure, agent.cleanup.executor; "
        "from agent.readers.kube_proxy import parse_metrics; "
        "parse_metrics(b'kubeproxy_sync_proxy_rules_last_timestamp_seconds 1\\n'); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'prometheus_client', 'pyroute2'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_metrics_samples_with_escaped_labels_timestamps_and_special_values() -> None:
    text = (
        '# HELP x y\na{x="1\\"}2",y="z\\\\n"} 3 1700000000000\nb 1e3\nc{} NaN\nd{le="+Inf"} +Inf\n'
    )
    got = [(s.name, s.labels, s.value) for s in parse_samples(text)]
    assert got[0] == ("a", {"x": '1"}2', "y": "z\\n"}, 3.0)
    assert got[1] == ("b", {}, 1000.0)
    assert got[2][0] == "c" and got[2][2] != got[2][2]  # NaN
    assert got[3] == ("d", {"le": "+Inf"}, float("inf"))


def test_plan_json_is_the_plan_document_one_step_a_line() -> None:
    plan = Plan(
        steps=(DeleteService("TCP 10.96.0.1:443", ("a", "b"), SERVICE),),
        kept=(Kept("ipset", "KUBE-X", "in use"),),
    )
    text = plan_json(plan)
    assert json.loads(text) == plan_document(plan)
    assert text.splitlines()[3].strip().startswith('{"phase": 1')
    empty = Plan(steps=(), kept=())
    assert json.loads(plan_json(empty)) == plan_document(empty)


def test_node_address_filter_agrees_with_ipaddress() -> None:
    import ipaddress
    import socket

    from agent.readers.links import _loopback_or_link_local

    for text in (
        "127.0.0.1",
        "127.9.9.9",
        "169.254.1.1",
        "169.255.0.1",
        "10.0.0.1",
        "::1",
        "fe80::1",
        "febf::1",
        "fec0::1",
        "fd00::1",
        "::ffff:127.0.0.1",
        "::",
    ):
        ip = ipaddress.ip_address(text)
        family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        got = _loopback_or_link_local(family, memoryview(ip.packed))
        assert got == (ip.is_loopback or ip.is_link_local), text


def test_the_kube_proxy_client_imports_no_http_stack_and_reads_chunked_answers() -> None:
    """A plain-socket GET: against a chunked HTTP/1.1 server (as Go's net/http answers an
    unsized body) and a sized one, with no urllib, http.client or idna imported."""
    code = """
import socket, sys, threading
from agent.readers.kube_proxy import _get
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(4)
answers = [
    b"HTTP/1.1 200 OK\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n5;x=y\\r\\nhello\\r\\n6\\r\\n world\\r\\n0\\r\\n\\r\\n",
    b"HTTP/1.1 503 Service Unavailable\\r\\nContent-Length: 4\\r\\n\\r\\nbusyXX",
]
def serve():
    for a in answers:
        c, _ = srv.accept(); c.recv(4096); c.sendall(a); c.close()
threading.Thread(target=serve, daemon=True).start()
url = f"http://127.0.0.1:{srv.getsockname()[1]}/metrics"
print(_get(url, 5), _get(url, 5))
print(sorted({"urllib.request", "http.client", "encodings.idna"} & set(sys.modules)))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    first, second = out.stdout.splitlines()
    assert first == "(200, b'hello world') (503, b'busy')"
    assert second == "[]"


def _modules_after(code: str) -> set[str]:
    """The modules after `code`, run without site (-S) as an installed agent would import
    them: the checkout's editable-install hook imports pathlib and urllib.parse itself."""
    path = os.pathsep.join([str(Path(__file__).parents[2]), sysconfig.get_paths()["purelib"]])
    out = subprocess.run(
        [sys.executable, "-S", "-c", code + "; import sys; print(' '.join(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": path},
    )
    return set(out.stdout.split())


def test_audit_imports_neither_the_checks_nor_the_plan_nor_yaml() -> None:
    """The click group imports a command's module only when it runs (agent.cli.LazyGroup)."""
    mods = _modules_after(
        "import click; from agent.cli import main; "
        "main.get_command(click.Context(main), 'audit'); "
        "import agent.collect, agent.classify, agent.collection, agent.views.report"
    )
    assert "agent.cli.audit" in mods
    assert not mods & {"yaml", "agent.views.checks", "agent.cleanup.plan", "agent.cli.checks"}
    assert not mods & {"agent.cli.serve", "agent.cli.cleanup", "prometheus_client"}


def test_restore_checks_with_the_classifier_but_reads_no_whole_node(tmp_path: Path) -> None:
    """restore checks every bundle line against the classifier's ownership rules (one owner
    per rule, a cost of the cold start accepted for safety) but reads only what it restores:
    never the whole node (agent.collect) nor kube-proxy."""
    from agent.cleanup import bundle

    with bundle.writing(tmp_path, hashlib.sha256(b"{}").hexdigest()) as out:
        out.write("plan.json", "{}")
    mods = _modules_after(
        "from agent.cli import main\n"
        "try:\n"
        # a lock of its own: the machine's default one may be a root run's, unreadable here
        f"    main(['restore', {str(out.folder)!r}, '--lock-file', {str(tmp_path / 'lock')!r}],"
        " standalone_mode=False)\n"
        "except SystemExit:\n"
        "    pass"
    )
    assert {"agent.cleanup.restore", "agent.cleanup.restore_check", "agent.classify"} <= mods
    assert not mods & {"agent.collect", "agent.readers.kube_proxy", "agent.views.report"}


def test_audit_imports_no_pathlib_or_shutil_and_its_compressors() -> None:
    """shutil pulls in zlib, bz2 and lzma; pathlib fnmatch and ntpath: none of them is any
    use to a read of /proc and netlink, and each module costs a cold start."""
    mods = _modules_after(
        "import click; from agent.cli import main; "
        "main.get_command(click.Context(main), 'audit'); "
        "import agent.collect, agent.classify, agent.collection, agent.views.report, "
        "agent.cli.permissions"
    )
    assert "agent.cli.audit" in mods and "agent.readers.tools" in mods
    assert not mods & {"pathlib", "shutil", "zlib", "bz2", "lzma", "fnmatch"}


# What the audit command must not import on its way in (`audit --help`, then the modules its
# run imports at the top): each is another command's (the metrics server, the cleanup, the
# fleet's clients) or is needed only once a tool runs (subprocess with signal, and fcntl: a
# network namespace with no iptables table runs none). Not listed, as imported anyway: locale
# (click's gettext) and selectors (socket). Measured in bench/README.md, "Cold start imports".
NOT_FOR_AUDIT = {
    "prometheus_client",
    "pyroute2",
    "yaml",
    "kubernetes",
    "http.server",
    "http.client",
    "ssl",
    "shutil",
    "agent.cleanup",
    "agent.views.metrics",
    "agent.views.server",
    "agent.views.checks",
    "subprocess",
    "signal",
    "fcntl",
}


def test_the_audit_command_imports_nothing_only_other_commands_or_a_tool_run_need() -> None:
    """The group's and audit's options parsed as `ipvs-leftovers audit --json` parses them (not
    --help: click's help formatter imports shutil), then what audit's run imports."""
    mods = _modules_after(
        "from agent.cli import main\n"
        "ctx = main.make_context('ipvs-leftovers', ['audit', '--json'])\n"
        "main.get_command(ctx, 'audit').make_context('audit', ['--json'], parent=ctx)\n"
        "import agent.cli.permissions, agent.collect, agent.classify, agent.collection, "
        "agent.views.report"
    )
    assert {"agent.cli.audit", "agent.readers.tools", "agent.readers.iptables"} <= mods
    assert sorted(mods & NOT_FOR_AUDIT) == []


def test_which_finds_the_first_executable_file_and_skips_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent.readers import tools

    plain, folder, first, second = (tmp_path / d for d in ("plain", "folder", "first", "second"))
    for d in (plain, folder, first, second):
        d.mkdir()
    (plain / "ipset").write_text("")  # not executable
    (folder / "ipset").mkdir()  # a directory, even if searchable
    for d in (first, second):
        (d / "ipset").write_text("#!/bin/sh\n")
        (d / "ipset").chmod(0o755)
    monkeypatch.chdir(second)
    monkeypatch.setenv("PATH", os.pathsep.join(["", str(plain), str(folder), str(first)]))
    assert tools.which("ipset") == str(first / "ipset")
    monkeypatch.setenv("PATH", os.pathsep.join(["", str(plain)]))  # cwd holds one: not taken
    with pytest.raises(tools.ToolError, match=r"no-such-tool not found \(install the no-such-tool"):
        tools.which("no-such-tool")


URLS = [
    "http://127.0.0.1:10249",
    "http://127.0.0.1:10249/",
    "http://127.0.0.1:10256/healthz",
    "http://LOCALHOST:10249/metrics?x=1&y=2#frag",
    "https://node.example:443/healthz",
    "http://[::1]:10249/proxyMode",
    "http://[FD00::1]/x",
    "http://user:secret@10.0.0.1:10249/m",
    "http://10.0.0.1",
    "http://10.0.0.1?q",
    "http://10.0.0.1#f",
    "http://10.0.0.1:/x",
    "http://:10249/x",
    "localhost:10249",
    "127.0.0.1:10249",
    "",
    "http:/x",
    "ftp://h/x",
    "HTTP://H:1/A",
]
BAD_URLS = [
    "http://127.0.0.1:port",
    "http://127.0.0.1:99999",
    "http://127.0.0.1:-1",
    "http://[::1",
    "http://::1]:80",
    "http://h:１２",
]


def test_split_url_reads_urls_as_urlsplit_does() -> None:
    from urllib.parse import urlsplit

    from agent.readers.urls import split_url

    for url in URLS:
        u, ref = split_url(url), urlsplit(url)
        target = (ref.path or "/") + (f"?{ref.query}" if ref.query else "")
        want = (ref.scheme, ref.hostname or "", ref.port, target)
        if ref.scheme in ("http", "https") and ref.hostname:
            assert (u.scheme, u.host, u.port, u.target, u.netloc) == (*want, ref.netloc), url
        else:  # not a URL the agent takes: both must say so
            assert u.scheme not in ("http", "https") or not u.host, url
    for url in BAD_URLS:
        with pytest.raises(ValueError):
            split_url(url)
        with pytest.raises(ValueError):
            urlsplit(url).port  # noqa: B018


def test_the_audit_path_imports_no_url_library() -> None:
    """The group checks both kube-proxy URLs on every command (click runs the callbacks on
    defaults too)."""
    mods = _modules_after(
        "import click, io, contextlib; from agent.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['audit', '--help'], standalone_mode=False)\n"
        "import agent.collect, agent.classify, agent.views.report, agent.readers.kube_proxy"
    )
    assert "agent.readers.urls" in mods
    assert not mods & {"urllib.parse", "ipaddress"}
