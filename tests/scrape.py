"""A service's ``/metrics`` read over HTTP and parsed by prometheus_client: ``{'name{k=v,...}': value}``.

Why keys as text: a test names the one sample it checks (``dlb_epp_picks_total{outcome=picked}``) as an
operator's query would, labels sorted.
"""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def metric_samples(address: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out
