"""The EPP's own families (``dlb_epp_*``), exported beside the leaf's ``dlb_leaf_*``: what an operator of a GIE
gateway asks of its picker — how picks end, where the gateway really sent them, what the pool is and
whether it is still followed, and the listener's bounds. Read from plain counters at scrape time.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from dlb.epp.k8s import PoolWatcher
from dlb.epp.limits import GrpcLimits, StreamGate
from dlb.epp.picker import EndpointPicker

#: Where the endpoints come from now (``dlb_epp_pool_source{state}``): a fixed list, DNS names, or an
#: InferencePool whose watches are both open, one is down (retrying; the last set serves), or which is deleted.
SOURCES = ("static", "dns", "watching", "watch_down", "deleted")


def pool_source(watcher: PoolWatcher | None, dns: bool) -> str:
    if watcher is None:
        return "dns" if dns else "static"
    if watcher.pool is not None and watcher.pool.deleted:
        return "deleted"
    return "watching" if all(watcher.stats.up.values()) else "watch_down"


def epp_families(epp: EndpointPicker, limits: GrpcLimits, gate: StreamGate, watcher: PoolWatcher | None,
                 dns: bool = False) -> Iterator[Metric]:
    picks = CounterMetricFamily("dlb_epp_picks", "Picks by outcome: picked, no_capacity (503), shed (429), hint_empty, "
                                "hint_foreign (503)", labels=["outcome"])
    for outcome, n in epp.outcomes.items():
        picks.add_metric([outcome], n)
    yield picks
    yield CounterMetricFamily("dlb_epp_served_moves", "Responses served elsewhere than picked (the gateway's report)",
                              value=epp.served_elsewhere)
    yield GaugeMetricFamily("dlb_epp_pool_endpoints", "Endpoints in the pool", value=0 if epp.empty else len(epp.state.servers))
    now = pool_source(watcher, dns)
    source = GaugeMetricFamily("dlb_epp_pool_source", "1 for the pool's source state", labels=["state"])
    for state in SOURCES:
        source.add_metric([state], float(state == now))
    yield source
    updates = CounterMetricFamily("dlb_epp_pool_updates", "Endpoint-set and InferencePool spec changes", labels=["what"])
    updates.add_metric(["endpoints"], epp.pool_updates)
    updates.add_metric(["spec"], watcher.stats.spec_changes if watcher else 0)
    yield updates
    lim = GaugeMetricFamily("dlb_epp_grpc_limit", "gRPC listener bounds", labels=["limit"])
    for name, v in limits.samples().items():
        lim.add_metric([name], v)
    yield lim
    yield CounterMetricFamily("dlb_epp_grpc_streams_refused", "ext_proc streams refused: max_streams open", value=gate.refused)
    if watcher is not None:
        errors = CounterMetricFamily("dlb_epp_pool_watch_errors", "Failed lists and watches, unusable pool edits", labels=["watch"])
        for what, n in watcher.stats.errors.items():
            errors.add_metric([what], n)
        yield errors
