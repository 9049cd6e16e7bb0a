"""Reading one sample out of a Prometheus text page (the services' ``/metrics``): pure, no client library."""

from __future__ import annotations


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text format (labels must match exactly the ones given)."""
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, lbl = head.partition("{")
        if metric != name:
            continue
        got = dict(kv.split("=", 1) for kv in lbl.rstrip("}").split(",") if kv) if lbl else {}
        got = {k: v.strip('"') for k, v in got.items()}
        if all(got.get(k) == v for k, v in labels.items()):
            return float(value)
    return None
