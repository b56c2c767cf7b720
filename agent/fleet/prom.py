"""The Prometheus HTTP API (instant queries, alerts), with the standard library only.

Every answer is checked before it is believed: HTTP 200, JSON, `status: success`, the result
type asked for. Anything else -- no connection, a timeout, a 5xx, garbage, an error status --
is `PromError` with one line, and the fleet commands refuse on it, creating nothing.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MAX_ANSWER = 256 * 1024 * 1024  # bytes: 5,000 nodes' series are a few MB


class PromError(Exception):
    pass


Labels = dict[str, str]


@dataclass
class Prometheus:
    url: str
    bearer_token_file: str | None = None
    ca_file: str | None = None
    timeout: float = 30.0
    calls: int = 0  # requests made (the measurement counts them)
    log: Callable[[str], None] | None = None
    _ssl: ssl.SSLContext | None = field(default=None, repr=False)
    _base: urllib.parse.SplitResult = field(init=False, repr=False)

    def __post_init__(self) -> None:
        parsed = urllib.parse.urlsplit(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise PromError(f"{self.url!r} is not an http(s)://HOST[:PORT][/PATH] URL")
        self.url = self.url.rstrip("/")
        self._base = urllib.parse.urlsplit(self.url)
        try:
            self._base.port  # noqa: B018 - raises on a port that is not a number
        except ValueError:
            raise PromError(f"{self.url!r} has a port that is not a number") from None
        if parsed.scheme == "https":
            try:
                self._ssl = ssl.create_default_context(cafile=self.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise PromError(f"cannot load the CA file {self.ca_file}: {exc}") from None

    def _connection(self) -> http.client.HTTPConnection:
        """A new connection, never through a proxy: the operator gave Prometheus' address."""
        host, port = self._base.hostname or "", self._base.port
        if self._ssl is not None:
            return http.client.HTTPSConnection(host, port, timeout=self.timeout, context=self._ssl)
        return http.client.HTTPConnection(host, port, timeout=self.timeout)

    def _token(self) -> str | None:
        if not self.bearer_token_file:
            return None
        try:
            with open(self.bearer_token_file) as f:  # re-read: projected tokens rotate
                return f.read().strip()
        except OSError as exc:
            raise PromError(
                f"cannot read the bearer token file {self.bearer_token_file}: {exc.strerror or exc}"
            ) from None

    def get(self, path: str, params: dict[str, str], post: bool = False) -> Any:
        """The `data` of a successful answer to path?params (a POST form when `post`: long
        queries do not hit URL length limits)."""
        form = urllib.parse.urlencode(params)
        headers = {"Content-Type": "application/x-www-form-urlencoded"} if post else {}
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        target = f"{self._base.path}{path}"
        if not post and form:
            target += f"?{form}"
        self.calls += 1
        what = f"Prometheus {self.url}{path}"
        exchange = _Exchange(self._connection(), "POST" if post else "GET", target, headers)
        if post:
            exchange.body = form.encode()
        code, reason, raw = exchange.run(self.timeout, what)
        if code != 200:
            detail = ""
            with contextlib.suppress(ValueError, AttributeError):
                detail = json.loads(raw[:65536]).get("error", "")
            raise PromError(f"{what}: HTTP {code} {reason}{': ' + detail if detail else ''}")
        if len(raw) > MAX_ANSWER:
            raise PromError(f"{what}: answer over {MAX_ANSWER} bytes")
        try:
            doc = json.loads(raw)
        except ValueError:
            raise PromError(f"{what}: the answer is not JSON") from None
        if not isinstance(doc, dict) or doc.get("status") != "success" or "data" not in doc:
            error = doc.get("error", "") if isinstance(doc, dict) else ""
            raise PromError(f"{what}: not a successful answer {error!r:.200}")
        return doc["data"]

    def query(self, expr: str, at: float) -> list[tuple[Labels, float]]:
        """An instant query at time `at`: (labels, value) per series; values must be numbers."""
        data = self.get("/api/v1/query", {"query": expr, "time": f"{at:.3f}"}, post=True)
        if not isinstance(data, dict) or data.get("resultType") != "vector":
            raise PromError(f"Prometheus: {expr!r:.120} did not give a vector")
        out = []
        for r in data.get("result", []):
            try:
                labels = {str(k): str(v) for k, v in r["metric"].items()}
                value = float(r["value"][1])
            except (KeyError, IndexError, TypeError, ValueError, AttributeError):
                raise PromError(f"Prometheus: a malformed sample for {expr!r:.120}") from None
            if not math.isnan(value):
                out.append((labels, value))
        return out

    def firing_alerts(self) -> list[Labels]:
        data = self.get("/api/v1/alerts", {})
        try:
            return [
                {str(k): str(v) for k, v in a["labels"].items()}
                for a in data["alerts"]
                if a.get("state") == "firing"
            ]
        except (KeyError, TypeError, AttributeError):
            raise PromError("Prometheus: a malformed /api/v1/alerts answer") from None


class _Exchange:
    """One request and its whole answer under one deadline. A socket timeout is per read: an
    answer dripping a byte at a time never meets it. So a worker thread does the exchange
    (connect, TLS, headers, body) and the caller waits for it `timeout` seconds in all, then
    shuts the socket down, which ends the worker's read at once."""

    def __init__(
        self, conn: http.client.HTTPConnection, method: str, target: str, headers: dict[str, str]
    ) -> None:
        self.conn, self.method, self.target, self.headers = conn, method, target, headers
        self.body: bytes | None = None
        self.answer: tuple[int, str, bytes] | None = None
        self.error: BaseException | None = None

    def _work(self) -> None:
        try:
            self.conn.request(self.method, self.target, body=self.body, headers=self.headers)
            response = self.conn.getresponse()
            self.answer = (response.status, response.reason, response.read(MAX_ANSWER + 1))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            self.error = exc
        finally:
            self.conn.close()

    def run(self, timeout: float, what: str) -> tuple[int, str, bytes]:
        worker = threading.Thread(target=self._work, name="prometheus-query", daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            sock = self.conn.sock
            if sock is not None:  # None while connecting: connect's own timeout ends it
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            raise PromError(f"{what}: no answer within {timeout:g}s")
        if self.answer is None:  # the worker set the error instead
            raise _one_line(self.error or RuntimeError("no answer"), timeout, what) from None
        return self.answer


def _one_line(exc: BaseException, timeout: float, what: str) -> BaseException:
    """The PromError for what the exchange raised; anything else unchanged (a bug)."""
    if isinstance(exc, TimeoutError):
        return PromError(f"{what}: no answer within {timeout:g}s")
    if isinstance(exc, ssl.SSLCertVerificationError):
        return PromError(
            f"{what}: its TLS certificate is not trusted ({exc.verify_message}): give --ca-file"
        )
    if isinstance(exc, http.client.HTTPException):
        return PromError(f"{what}: not an HTTP answer ({type(exc).__name__})")
    if isinstance(exc, OSError):
        return PromError(f"{what}: unreachable ({exc})")
    return exc
