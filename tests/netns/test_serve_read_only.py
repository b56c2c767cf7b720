"""Port 9437 is open to anyone who can reach the node (hostNetwork): serve answers GET and HEAD
only. Every other method is 501 with nothing done, whatever the path and body
(docs/threat-model.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pytest

from lab import build
from lab.scenarios import realistic_node
from tests.dumps import dump
from tests.serving import serving

pytestmark = pytest.mark.netns

# Sends each raw request on its own connection; prints each answer's status line.
CLIENT = r"""
import json, socket, sys
out = []
for method in sys.argv[1:]:
    body = b"mode=cleanup&apply=1"
    s = socket.create_connection(("127.0.0.1", 9437), 10)
    s.sendall(f"{method} /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
              "Connection: close\r\n\r\n".encode() + body)
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    out.append(data.split(b"\r\n", 1)[0].decode())
    s.close()
print(json.dumps(out))
"""


def test_methods_other_than_get_and_head_are_501_and_change_nothing(
    netns: Callable[[], str],
) -> None:
    ns = netns()
    build.build(ns, realistic_node())
    before = dump(ns)
    methods = ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "GET", "HEAD"]
    with serving(ns):
        p = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-c", CLIENT, *methods],
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
    codes = [line.split(" ", 2)[1] for line in json.loads(p.stdout)]
    assert dict(zip(methods, codes, strict=True)) == {
        "POST": "501", "PUT": "501", "DELETE": "501", "PATCH": "501", "OPTIONS": "501",
        "GET": "200", "HEAD": "200",
    }  # fmt: skip
    assert dump(ns) == before
    assert any("KUBE-" in line for lines in before.values() for line in lines)  # leftovers
