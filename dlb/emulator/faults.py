"""Fault knobs of an emulated server: errors, slowness and outages on demand (pure).

Fault tests need a server to turn bad *while it runs* and recover, so the same knobs are set by CLI
flags at start-up and changed at runtime over ``POST /admin/faults``. Updates are partial (only the
given keys change) and validated as a whole before anything is applied.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from dlb.errors import DlbError


class FaultError(DlbError, ValueError):
    """Invalid fault settings; the message names the field."""


#: The knobs' upper bounds: 1e308 was accepted and hung every request for good (a step's end is
#: ``slowdown`` × its time). 1000 × still turns a 5-ms step into 5 s; 10 minutes outlasts any request timeout.
MAX_SLOWDOWN = 1000.0
MAX_DELAY_MS = 600_000.0


@dataclass(frozen=True)
class Faults:
    error_rate: float = 0.0  # fraction of inference requests answered at once with error_status
    error_status: int = 500  # HTTP status of injected errors (4xx/5xx)
    slowdown: float = 1.0  # multiplies every engine step time (2.0 = GPU twice as slow)
    extra_latency_ms: float = 0.0  # fixed delay before an inference request is handled
    #: ``/health`` answers this late: a loaded vLLM's health call waits on its busy engine process.
    health_delay_ms: float = 0.0
    down: bool = False  # answer inference, /v1/models and /health with 503 (the admin API still works)

    def __post_init__(self) -> None:
        def num(name: str, v: Any) -> float:
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise FaultError(f"{name}: must be a number, got {v!r}")
            return float(v)

        if not 0.0 <= num("error_rate", self.error_rate) <= 1.0:
            raise FaultError(f"error_rate: must be in [0, 1], got {self.error_rate!r}")
        if not isinstance(self.error_status, int) or isinstance(self.error_status, bool) or not 400 <= self.error_status <= 599:
            raise FaultError(f"error_status: must be an HTTP error status 400..599, got {self.error_status!r}")
        if not 0 < num("slowdown", self.slowdown) <= MAX_SLOWDOWN:
            raise FaultError(f"slowdown: must be in (0, {MAX_SLOWDOWN:g}], got {self.slowdown!r}")
        if not 0 <= num("extra_latency_ms", self.extra_latency_ms) <= MAX_DELAY_MS:
            raise FaultError(f"extra_latency_ms: must be in [0, {MAX_DELAY_MS:g}], got {self.extra_latency_ms!r}")
        if not 0 <= num("health_delay_ms", self.health_delay_ms) <= MAX_DELAY_MS:
            raise FaultError(f"health_delay_ms: must be in [0, {MAX_DELAY_MS:g}], got {self.health_delay_ms!r}")
        if not isinstance(self.down, bool):
            raise FaultError(f"down: must be true or false, got {self.down!r}")

    def updated(self, patch: Any) -> Faults:
        """A copy with the keys of ``patch`` (a JSON object) changed; unknown keys are errors."""
        if not isinstance(patch, dict):
            raise FaultError(f"body: must be a JSON object of fault settings, got {type(patch).__name__}")
        known = {f.name for f in fields(self)}
        for k in patch:
            if k not in known:
                raise FaultError(f"{k}: unknown fault setting (known: {', '.join(sorted(known))})")
        return replace(self, **patch)

    def inject_error(self, rng: random.Random) -> bool:
        return self.error_rate > 0 and rng.random() < self.error_rate

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
