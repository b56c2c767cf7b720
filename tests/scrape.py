"""Run inside a test namespace: scrape a URL N times concurrently, print JSON results.

python tests/scrape.py URL N [--insecure]  ->  {"codes": [...], "samples": {series: value}}
(samples of the first answer only, keyed `name{label="v",...}`).
"""

from __future__ import annotations

import json
import ssl
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from prometheus_client.parser import text_string_to_metric_families


def main() -> None:
    url, n = sys.argv[1], int(sys.argv[2])
    ctx = ssl._create_unverified_context() if "--insecure" in sys.argv else None
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
    )

    def get(_: int) -> tuple[int, str, str]:
        with opener.open(url, timeout=120) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()

    with ThreadPoolExecutor(max_workers=n) as pool:
        results = list(pool.map(get, range(n)))
    samples = {}
    if "/metrics" in url:
        for fam in text_string_to_metric_families(results[0][2]):
            for s in fam.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    print(
        json.dumps(
            {
                "codes": [r[0] for r in results],
                "types": sorted({r[1] for r in results}),
                "bodies": sorted({r[2] for r in results})[:1] if "/metrics" not in url else [],
                "samples": samples,
            }
        )
    )


if __name__ == "__main__":
    main()
