"""The fleet talks to an https Prometheus only when its certificate chains to the CA the
operator gives (`--ca-file`, else the system's): a server with a certificate of another CA is
refused with one line, exit 4 (docs/threat-model.md)."""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from agent.cli import main
from agent.fleet.prom import Prometheus

ANSWER = {"status": "success", "data": {"resultType": "vector", "result": []}}


def ca_and_cert(tmp: Path, name: str) -> tuple[Path, Path, Path]:
    """A CA, and a key and certificate it signs for IP 127.0.0.1."""
    ca_key, ca, key, csr, cert = (tmp / f"{name}{x}" for x in
                                  ("-ca.key", "-ca.pem", ".key", ".csr", ".pem"))  # fmt: skip

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key),
            "-out", str(ca), "-days", "1", "-subj", f"/CN={name} CA")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
            "-subj", "/CN=prometheus")  # fmt: skip
    ext = tmp / f"{name}.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
            "-CAcreateserial", "-out", str(cert), "-days", "1", "-extfile", str(ext))  # fmt: skip
    return ca, cert, key


@contextmanager
def tls_server(cert: Path, key: Path) -> Iterator[str]:
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.dumps(ANSWER).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    s = ThreadingHTTPServer(("127.0.0.1", 0), H)
    s.daemon_threads = True
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    s.socket = ctx.wrap_socket(s.socket, server_side=True)
    threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        yield f"https://127.0.0.1:{s.server_address[1]}"
    finally:
        s.shutdown()
        s.server_close()


def test_https_prometheus_trusted_only_through_the_ca_given(tmp_path: Path) -> None:
    ca, cert, key = ca_and_cert(tmp_path, "right")
    other_ca, _, _ = ca_and_cert(tmp_path, "other")
    with tls_server(cert, key) as url:
        assert Prometheus(url, ca_file=str(ca), timeout=5).query("up", 0) == []
        r = CliRunner().invoke(
            main,
            ["fleet", "status", "--prometheus-url", url, "--ca-file", str(other_ca),
             "--prometheus-timeout", "5s"],
        )  # fmt: skip
    assert r.exit_code == 4
    assert r.stderr == (
        f"ipvs-leftovers: fleet status refused: Prometheus {url}/api/v1/query: its TLS "
        "certificate is not trusted (unable to get local issuer certificate): give --ca-file\n"
    )


def test_a_ca_file_that_is_not_a_certificate_is_a_usage_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    r = CliRunner().invoke(
        main,
        ["fleet", "status", "--prometheus-url", "https://127.0.0.1:9", "--ca-file", str(junk)],
    )
    assert r.exit_code == 2
    assert f"cannot load the CA file {junk}" in r.stderr
