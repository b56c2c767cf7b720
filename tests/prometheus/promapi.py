"""Run inside the Prometheus namespace: GET one Prometheus API path, print the JSON body.

python tests/prometheus/promapi.py PORT PATH   (PATH with its query string, URL-encoded)
"""

from __future__ import annotations

import sys
import urllib.request


def main() -> None:
    port, path = sys.argv[1], sys.argv[2]
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{port}{path}", timeout=20) as r:
        sys.stdout.write(r.read().decode())


if __name__ == "__main__":
    main()
