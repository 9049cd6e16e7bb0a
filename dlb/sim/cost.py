"""What an experiment at the full protocol will cost, projected from short measured runs.

Issue 12 asks that every experiment at its protocol (:data:`dlb.sim.experiments.PROTOCOL`) finish in
one run of ≤ 90 minutes on 2 cores. Running it to find out costs hours, so ``dlb sim --estimate``
measures instead one *probe scenario* per experiment, every variant and policy, for a short time,
and scales each run's CPU seconds by what the cost is proportional to: simulated time (events
per simulated second are steady once the first refit is past) and the request rate (arrivals; the
probe scenario's demand vs the protocol's scenarios', which :func:`dlb.sim.scenario.generate`
draws without simulating). The per-cell probe loop grows with cells², not demand, so the projection
is rough (±30 % on the measured short runs); it is for scheduling, not a result.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dlb.sim.experiments import EXPERIMENTS, PROTOCOL, Job, Protocol, run_job
from dlb.sim.policies import POLICIES
from dlb.sim.scenario import generate


@dataclass(frozen=True)
class CostEstimate:
    experiment: str
    runs: int  # at the protocol
    measured_cpu_s: float  # of the short probe runs
    projected_cpu_s: float  # of the whole experiment at the protocol, on one core

    def wall_s(self, cores: int) -> float:
        """Wall seconds on ``cores`` workers if the runs split evenly (they are independent)."""
        return self.projected_cpu_s / max(cores, 1)


def demand(variant_kwargs: dict, seed: int, minutes: float) -> float:
    """Requests per second of scenario ``seed`` in that variant (drawn, not simulated)."""
    return float(generate(seed, duration_s=minutes * 60.0, **variant_kwargs).demand.sum())


def estimate(experiments: Iterable[str], seed: int = 1, probe_minutes: float = 0.5, probe_scenario: int = 0,
             policies: Iterable[str] = POLICIES, protocol: Protocol = PROTOCOL, root_replicas: int = 1,
             commit: str = "unknown", server_model: str | None = None) -> list[CostEstimate]:
    """Run every (variant, policy) of each experiment once on one probe scenario for ``probe_minutes``
    and project the experiment's CPU seconds at ``protocol`` (``server_model``: as ``dlb sim --server-model``)."""
    pols = tuple(policies)
    probe_seed = seed * 1000 + probe_scenario
    out = []
    for exp in experiments:
        measured = projected = 0.0
        for var in EXPERIMENTS[exp]:
            kw = Job(exp, var, probe_seed, 0, "Rand", 60.0, server_model=server_model).scenario_kwargs()
            full = sum(demand(kw, seed * 1000 + k, protocol.minutes) for k in range(protocol.scenarios))
            scale = (protocol.minutes / probe_minutes) * full / demand(kw, probe_seed, probe_minutes)
            for p in pols:
                rec = run_job(Job(exp, var, probe_seed, 0, p, probe_minutes * 60.0, root_replicas, commit,
                                  server_model=server_model))
                measured += rec["cpu_s"]
                projected += rec["cpu_s"] * scale * protocol.trials_for(exp)
        runs = len(EXPERIMENTS[exp]) * len(pols) * protocol.scenarios * protocol.trials_for(exp)
        out.append(CostEstimate(exp, runs, measured, projected))
    return out


def markdown(estimates: list[CostEstimate], cores: int = 2) -> str:
    rows = ["| experiment | runs at the protocol | measured CPU-s (probe runs) | projected CPU-s | "
            f"projected wall min on {cores} cores |", "| --- | --- | --- | --- | --- |"]
    for e in estimates:
        rows.append(f"| {e.experiment} | {e.runs} | {e.measured_cpu_s:.1f} | {e.projected_cpu_s:.0f} | "
                    f"{e.wall_s(cores) / 60:.0f} |")
    return "\n".join(rows)
