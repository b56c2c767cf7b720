"""Run inside a test namespace: one HTTP(S) request, print what came back as JSON.

python tests/fetch.py URL [--method M] [--header NAME:VALUE]... [--timeout S] [--insecure]
-> {"status": 200, "content_length": "123", "body": "...", "seconds": 0.01}
   or {"error": "timed out", "seconds": 5.0} when no answer came within the timeout.
"""

from __future__ import annotations

import argparse
import json
import ssl
import time
import urllib.error
import urllib.request


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--method", default="GET")
    ap.add_argument("--header", action="append", default=[])
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--insecure", action="store_true")
    args = ap.parse_args()
    ctx = ssl._create_unverified_context() if args.insecure else None
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
    )
    headers = dict(h.split(":", 1) for h in args.header)
    request = urllib.request.Request(args.url, method=args.method, headers=headers)
    start = time.monotonic()
    try:
        with opener.open(request, timeout=args.timeout) as r:
            out = {
                "status": r.status,
                "content_length": r.headers.get("Content-Length"),
                "content_type": r.headers.get("Content-Type"),
                "body": r.read().decode(),
            }
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        out = {"error": str(getattr(exc, "reason", exc))}
    out["seconds"] = time.monotonic() - start
    print(json.dumps(out))


if __name__ == "__main__":
    main()
