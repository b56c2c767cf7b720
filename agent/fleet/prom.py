"""The Prometheus HTTP API (instant queries, alerts), with the standard library only.

Every answer is checked before it is believed: HTTP 200, JSON, `status: success`, the result
type asked for. Anything else -- no connection, a timeout, a 5xx, garbage, an error status --
is `PromError` with one line, and the fleet commands refuse on it, creating nothing.
"""

from __future__ import annotations

import contextlib
import json
import math
import ssl
import urllib.error
import urllib.parse
import urllib.request
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

    def __post_init__(self) -> None:
        parsed = urllib.parse.urlsplit(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise PromError(f"{self.url!r} is not an http(s)://HOST[:PORT][/PATH] URL")
        self.url = self.url.rstrip("/")
        if parsed.scheme == "https":
            self._ssl = ssl.create_default_context(cafile=self.ca_file)

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
        if post:
            request = urllib.request.Request(
                f"{self.url}{path}",
                data=form.encode(),
                headers={"Content-Type": "application/x-www-form-urlencoded"},
                method="POST",
            )
        else:
            request = urllib.request.Request(f"{self.url}{path}{'?' + form if form else ''}")
        token = self._token()
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=self._ssl)
        )
        self.calls += 1
        what = f"Prometheus {self.url}{path}"
        try:
            with opener.open(request, timeout=self.timeout) as answer:
                raw = answer.read(MAX_ANSWER + 1)
        except urllib.error.HTTPError as exc:
            detail = ""
            with contextlib.suppress(ValueError, AttributeError, OSError):
                detail = json.loads(exc.read(65536)).get("error", "")
            raise PromError(
                f"{what}: HTTP {exc.code} {exc.reason}{': ' + detail if detail else ''}"
            ) from None
        except TimeoutError:
            raise PromError(f"{what}: no answer within {self.timeout:g}s") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError):
                raise PromError(f"{what}: no answer within {self.timeout:g}s") from None
            raise PromError(f"{what}: unreachable ({reason})") from None
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
