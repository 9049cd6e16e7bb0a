"""The stress scenarios of ``dlb demo --compare``: what an operator fears, each a fixed seeded workload.

Pure definitions (no I/O). A scenario fixes the offered load (fraction of the fleet's computed
capacity), the workload's seed and shape, extra arrival phases and a fault on one cell's servers
(``POST /admin/faults`` of the emulator). Every policy of one (scenario, trial) gets the same requests:
the seed is ``seed + 1000 × trial``, so trials differ from each other but not between policies.

- ``steady``: 75 %, nothing happens.
- ``overload``: 95 %, plus a phase at 110 % (an extra 15 %) from 40 % to 70 % of the run.
- ``slow-cell``: 75 %; the degraded cell's servers 3× slower from 30 % to 55 % of the run.
- ``cell-outage``: 75 %; every server of the degraded cell down for 25 s from 30 % of the run (the
  emulator's ``down``: inference and ``/health`` answer 503 — the process stays up, so "killed" is
  emulated as a server that refuses everything, which the leaf's health checks see the same way).
- ``burst``: 75 %, and twice the arrival rate for 30 s from 30 % of the run.
- ``long-prompts``: 75 % of a capacity computed for long-tailed prompts (log-normal σ 1.4 instead of
  0.8, capped at 12,000 tokens instead of 4,000), so sizes, not counts, decide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from dlb.load.workload import WorkloadSpec
from dlb.testbed.fleet import Fleet, fleet_capacity_rps

#: Seconds the client waits for a request before it counts as failed; a failed or shed request enters
#: every latency figure of the comparison as this value (the design's evaluation rule).
REQUEST_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Scenario:
    name: str
    load: float
    seed: int
    #: (start fraction of the run, end fraction, extra load as a fraction of capacity)
    phase: tuple[float, float, float] | None = None
    #: The fault posted to the degraded cell's servers: "slow" (the fleet's slowdown) or "down".
    fault: str | None = None
    #: (start fraction of the run, length in seconds, or None: until ``fault_end`` of the run)
    fault_start: float = 0.3
    fault_seconds: float | None = None
    fault_end: float = 0.55
    phase_seconds: float | None = None
    workload: dict[str, Any] = field(default_factory=dict)  # WorkloadSpec field overrides

    def fault_window(self, duration_s: float) -> tuple[float, float] | None:
        if self.fault is None:
            return None
        start = self.fault_start * duration_s
        end = start + self.fault_seconds if self.fault_seconds is not None else self.fault_end * duration_s
        return start, end

    def phase_window(self, duration_s: float) -> tuple[float, float, float] | None:
        """(start s, length s, extra load) of the extra-arrival phase."""
        if self.phase is None:
            return None
        a, b, extra = self.phase
        start = a * duration_s
        length = self.phase_seconds if self.phase_seconds is not None else (b - a) * duration_s
        return start, length, extra

    def check(self, duration_s: float) -> None:
        """Raise if a window does not fit the run (a fault that never recovers is another scenario)."""
        for what, w in (("fault", self.fault_window(duration_s)), ("phase", self.phase_window(duration_s))):
            if w is None:
                continue
            end = w[1] if what == "fault" else w[0] + w[1]
            if end >= duration_s:
                raise ValueError(f"--duration: scenario {self.name}'s {what} ends at {end:g} s; the run must be longer "
                                 f"(got {duration_s:g} s)")


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("steady", 0.75, seed=11),
    Scenario("overload", 0.95, seed=12, phase=(0.4, 0.7, 0.15)),
    Scenario("slow-cell", 0.75, seed=13, fault="slow"),
    Scenario("cell-outage", 0.75, seed=14, fault="down", fault_seconds=25.0),
    Scenario("burst", 0.75, seed=15, phase=(0.3, 0.0, 0.75), phase_seconds=30.0),
    Scenario("long-prompts", 0.75, seed=16, workload={"prompt_sigma": 1.4, "max_prompt": 12000}),
)}


def trial_seed(scenario: Scenario, trial: int) -> int:
    return scenario.seed + 1000 * trial


#: Extra-arrival phases: (start s, the phase's own workload).
Phases = list[tuple[float, WorkloadSpec]]


def plan_workload(fleet: Fleet, scenario: Scenario | None, duration_s: float, seed: int,
                  load: float) -> tuple[WorkloadSpec, Phases, dict[str, float]]:
    """The requests a demo run sends: its workload, extra-arrival phases and the fleet capacity they are
    sized from. One function for ``dlb demo`` and its simulator twin, so both see the same requests.

    The first root cell sends 4 parts of the load, every other root cell 1 (the demo's 4:1 split).
    """
    sources = {c.name: (4.0 if i == 0 else 1.0) for i, c in enumerate([c for c in fleet.cells if c.root])}
    probe = WorkloadSpec(rate_rps=1.0, duration_s=duration_s, sources=sources or {"": 1.0}, seed=seed,
                         **(scenario.workload if scenario else {}))
    # Multi-turn prompts grow: ~1.5× the first turn's median on average with the default spread; a
    # wider log-normal spread scales the mean by exp(Δσ²/2).
    mean_prompt = probe.prompt_median * 1.5 * math.exp((probe.prompt_sigma ** 2 - WorkloadSpec.prompt_sigma ** 2) / 2)
    capacity = fleet_capacity_rps(fleet, mean_prompt, probe.mean_output())
    spec = replace(probe, rate_rps=(scenario.load if scenario else load) * sum(capacity.values()))
    phases: Phases = []
    ph = scenario.phase_window(duration_s) if scenario is not None else None
    if ph is not None:
        start, length, extra = ph
        phases = [(start, replace(spec, rate_rps=extra * sum(capacity.values()), duration_s=length, seed=spec.seed + 500))]
    return spec, phases, capacity
