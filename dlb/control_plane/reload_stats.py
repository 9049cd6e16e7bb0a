"""What the control plane's config reloads did, for ``/metrics``: counts by outcome, when the running
config was loaded, and a digest of it.

Why: a refused SIGHUP was only a log line and a half-applied one (fields bound at start) a warning, so
an operator could alert on neither; and two replicas serving different files looked the same.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric

from dlb.config.model import Config

#: ``applied``: in service; ``needs_restart``: in service except fields bound at start
#: (:mod:`dlb.config.bound_at_start`); ``refused``: the file did not load, the running config stays.
OUTCOMES = ("applied", "needs_restart", "refused")


def config_digest(config: Config) -> str:
    """12 hex digits of the config as parsed (the root token is never in its repr): equal on replicas
    serving the same settings whatever the file's comments or key order."""
    return hashlib.sha256(repr(config).encode()).hexdigest()[:12]


@dataclass
class ReloadStats:
    count: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    loaded_unix: float = 0.0
    digest: str = ""
    source: str = ""

    def loaded(self, config: Config, now: float | None = None) -> None:
        self.loaded_unix = time.time() if now is None else now
        self.digest, self.source = config_digest(config), config.source

    def families(self) -> Iterator[Metric]:
        reloads = CounterMetricFamily("dlb_xds_config_reloads", "config reloads by outcome (refused: the running config stays)",
                                      labels=["result"])
        for outcome in OUTCOMES:
            reloads.add_metric([outcome], self.count[outcome])
        yield reloads
        yield GaugeMetricFamily("dlb_xds_config_loaded_timestamp_seconds", "when the running config was loaded (Unix time)",
                                value=self.loaded_unix)
        info = InfoMetricFamily("dlb_xds_config", "the running config: a digest of its settings and its file")
        info.add_metric([], {"digest": self.digest, "source": self.source})
        yield info
