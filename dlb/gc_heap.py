"""Keep Python's full garbage collections short in long-running services, and show them in /metrics.

A full (generation-2) collection walks every tracked object in the process. A service's heap is mostly
what it built at start — imported modules, protobuf descriptors, the config, first snapshots — and none
of that ever becomes garbage, yet each full collection walked all of it: on the control plane 38-60 ms
on a quiet 2-core box, 101 ms on a loaded one, and the allocations of a hostile client (issue 14 row 6:
bloated ADS streams) are what trigger it. :func:`freeze_heap` moves everything alive at that point to
the interpreter's permanent generation (``gc.freeze``), so later collections walk only what was
allocated since. :func:`raise_young_threshold` makes the young collections rarer where each request
allocates (the control plane's xDS pushes). :class:`GcPauses` times every collection (``gc.callbacks``)
for ``/metrics``.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

#: Young-generation threshold of the control plane (Python's default is 700 allocations). Each push to
#: an xDS stream allocates a few dozen tracked objects (gRPC call state, futures, requests), so at
#: 5,000 streams the default collected the young generation hundreds of times per update, promoting
#: every object then in flight: garbage collection was 25 % of the server's CPU per update
#: (110 of 470 µs per stream). At 50,000 most of them die before a collection sees them (7 µs).
YOUNG_THRESHOLD = 50_000


def raise_young_threshold(objects: int = YOUNG_THRESHOLD) -> tuple[int, int, int]:
    """Collect the youngest generation every ``objects`` net allocations instead of Python's 700 (the
    older generations keep their ratios); returns the thresholds now in effect. A collection then walks
    at most ``objects`` young objects (a few ms), in exchange for far fewer of them."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(objects, older, oldest)
    return gc.get_threshold()


def freeze_heap() -> int:
    """Collect once, then exempt every surviving object from future collections; returns how many are frozen.

    Call it once the service has started (modules imported, config loaded, servers listening). Objects
    frozen here are never freed even if they later become garbage: fine for start-up state, which lives
    as long as the process.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class GcPauses:
    """Time spent in each collection, by generation: total seconds, count and the longest one.

    ``prefix`` names the families after the service that exports them (``dlb_xds`` on the control plane).
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.seconds = [0.0, 0.0, 0.0]
        self.count = [0, 0, 0]
        self.longest = [0.0, 0.0, 0.0]
        self._started: float | None = None

    def install(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self._started is None:
            return
        took, self._started = time.perf_counter() - self._started, None
        g = min(max(int(info.get("generation", 2)), 0), 2)
        self.seconds[g] += took
        self.count[g] += 1
        self.longest[g] = max(self.longest[g], took)

    def families(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(f"{self.prefix}_gc_frozen_objects", "objects exempt from garbage collection (frozen after start)",
                                value=gc.get_freeze_count())
        total = CounterMetricFamily(f"{self.prefix}_gc_pause_seconds", "time the process spent in garbage collections", labels=["generation"])
        longest = GaugeMetricFamily(f"{self.prefix}_gc_pause_longest_seconds", "the longest single garbage collection so far",
                                    labels=["generation"])
        for g in range(3):
            total.add_metric([str(g)], self.seconds[g])
            longest.add_metric([str(g)], self.longest[g])
        yield total
        yield longest
