"""The paper's experiments (Appendix B) as job lists, run in parallel, reduced to result records.

A job is one (experiment, variant, scenario, trial, policy). Scenario ``k`` of a run with ``--seed s``
has seed ``s·1000 + k``; every variant of an experiment reuses that seed, so a sweep changes only the
swept quantity, and every policy sees the same arrivals (common random numbers), which is what makes
the per-scenario normalisation by Rand meaningful.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any

import numpy as np

from dlb.core.admission import AdmissionConfig
from dlb.core.shedding import ShedConfig
from dlb.provenance import code_tree, git_commit
from dlb.resumable import ignore_sigint
from dlb.sim.engine import SimConfig, simulate
from dlb.sim.outcome import DEFAULT_REQUEST_TIMEOUT_S, complete
from dlb.sim.policies import BASELINES, POLICIES
from dlb.sim.scenario import Workload, generate


@dataclass(frozen=True)
class Variant:
    label: str
    #: Keyword arguments of :func:`dlb.sim.scenario.generate`.
    params: tuple[tuple[str, object], ...]
    #: Numeric x value for sweep plots.
    x: float = 0.0

    def kwargs(self) -> dict[str, Any]:
        """``params`` as keyword arguments of :func:`~dlb.sim.scenario.generate` (values are whatever it takes)."""
        return dict(self.params)


def _v(label: str, x: float = 0.0, **params: object) -> Variant:
    return Variant(label, tuple(sorted(params.items())), x)


EXPERIMENTS: dict[str, tuple[Variant, ...]] = {
    "baseline": (_v("util=0.8", 0.8, utilization=0.8),),
    "utilization": tuple(_v(f"util={u}", u, utilization=u) for u in (0.5, 0.65, 0.8, 0.9, 0.95)),
    "length": tuple(
        _v(f"y={lbl}", y, length_factor=y)
        for lbl, y in (("1/10", 0.1), ("1/4", 0.25), ("1/2", 0.5), ("1", 1.0), ("2", 2.0), ("4", 4.0), ("10", 10.0))
    ),
    "homogeneous": (_v("homogeneous", 0.8, homogeneous=True),),
    "burst": (_v("burst", 0.8, disruption="burst"),),
    "outage": (_v("outage", 0.8, disruption="outage"),),
    "noise": tuple(_v(f"eps={e}", e, noise_eps=e) for e in (0.0, 0.1, 0.25, 0.5, 0.75)),
    # Sensitivity of DLB's gain over Rand to the server model (issue 12): the paper's pipeline server
    # vs the emulator's continuous-batching engine on the measured step-time curve, same scenarios.
    "server-model": (_v("pipeline", 0.0, server_model="pipeline"), _v("batched", 1.0, server_model="batched")),
    # The leaf's pick (issue 12): power of two on RIF vs Prequal on tokens waiting, on the batched server.
    "leaf-pick": (_v("rif", 0.0, server_model="batched", leaf_pick="rif"),
                  _v("prequal", 1.0, server_model="batched", leaf_pick="prequal")),
}

METRICS = ("mean", "p50", "p90", "p99", "error_rate", "mean_latency_with_failures", "p90_latency_with_failures",
           "shed_rate", "overflow_rate", "refused_rate", "timed_out_rate", "cancelled_rate", "client_failure_rate")


@dataclass(frozen=True)
class Protocol:
    """The paper's evaluation protocol as issue 12 fixes it (the defaults of ``dlb sim``): every
    experiment ``minutes`` long over ``scenarios`` scenarios, ``baseline_trials`` trials of the
    baseline and ``trials`` of the others (the paper: 5 — fewer so each experiment fits one run of
    ≤ 90 min on 2 cores; docs/simulator.md has the measured cost). The disruption window is fixed
    by :func:`dlb.sim.scenario.generate`: 30 %–70 % of the run, minutes 3–7 of 10."""

    scenarios: int = 10
    minutes: float = 10.0
    baseline_trials: int = 3
    trials: int = 2

    def trials_for(self, experiment: str) -> int:
        return self.baseline_trials if experiment == "baseline" else self.trials

    def met_by(self, experiment: str, scenarios: int, trials: int, minutes: float) -> bool:
        """Whether runs of ``experiment`` with that many scenarios and trials, ``minutes`` long, follow it."""
        return scenarios >= self.scenarios and trials >= self.trials_for(experiment) and minutes >= self.minutes - 1e-9


PROTOCOL = Protocol()


@dataclass(frozen=True)
class Job:
    experiment: str
    variant: Variant
    scenario: int
    trial: int
    policy: str
    duration_s: float
    root_replicas: int = 1
    #: The git commit of the code that runs the job (recorded in every result).
    commit: str = "unknown"
    #: The git tree of ``dlb/`` at that commit (:func:`dlb.provenance.code_tree`): what ``--resume``
    #: and the report compare, so commits that changed only docs or tests do not split one build.
    code: str = "unknown"
    #: ``dlb sim --server-model``: the server model of variants that do not set their own (None: the
    #: workload's default).
    server_model: str | None = None
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    #: ``dlb sim --deadline-shed``: DLB roots shed what their models put past the timeout.
    deadline_shed: bool = ShedConfig.deadline
    #: ``dlb sim --timeouts``: what happens to a request whose client's timeout passed.
    timeouts: str = "cancel"
    #: ``dlb sim --admission``: DLB leaves refuse what would stay past a share of the timeout.
    admission: bool = AdmissionConfig.enabled
    #: ``dlb sim --retry``: DLB roots retry a cell's refusal once on their fallback cell.
    retry: bool = SimConfig.cross_cell_retry
    #: ``dlb sim --admission-slowdown``: admission refuses only past this many times a server's own pace.
    admission_slowdown: float = AdmissionConfig.slowdown

    def key(self) -> tuple:
        """What a record of this job is recognised by when a run resumes (:func:`record_key`)."""
        return (self.experiment, self.variant.label, self.policy, self.scenario, self.trial, self.duration_s,
                self.root_replicas, self.code, self.effective_server_model(), self.timeouts, float(self.request_timeout_s),
                self.deadline_shed, self.admission, self.retry, float(self.admission_slowdown))

    def scenario_kwargs(self) -> dict[str, Any]:
        """The variant's arguments of :func:`~dlb.sim.scenario.generate`, ``--server-model`` applied
        where the variant does not choose the server model itself (the server-model experiment does)."""
        kw = self.variant.kwargs()
        if self.server_model is not None and "server_model" not in kw:
            kw["server_model"] = self.server_model
        return kw

    def effective_server_model(self) -> str:
        return str(self.scenario_kwargs().get("server_model", Workload().server_model))

    def cost(self) -> float:
        """Rough relative cost (arrivals × a per-policy factor) so big jobs start first."""
        sc = generate(self.scenario, duration_s=self.duration_s, **self.scenario_kwargs())
        factor = 1.0 if self.policy in BASELINES else 3.0 * self.root_replicas**0.3
        return float(sc.demand.sum()) * self.duration_s * factor * sc.n**0.3


def make_jobs(experiments: Iterable[str], scenarios: int, trials: int | None, minutes: float, seed: int,
              policies: Iterable[str] = POLICIES, root_replicas: int = 1, commit: str | None = None,
              code: str | None = None, server_model: str | None = None,
              request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S, deadline_shed: bool = ShedConfig.deadline,
              timeouts: str = "cancel", admission: bool = AdmissionConfig.enabled,
              retry: bool = SimConfig.cross_cell_retry, admission_slowdown: float = AdmissionConfig.slowdown) -> list[Job]:
    """Every (experiment, variant, scenario, trial, policy); ``trials=None``: the protocol's per experiment.
    ``commit``/``code``: the code's commit and ``dlb/`` tree, taken when a long run started (default: now).
    ``server_model``: for variants that do not set it (None: the workload's default)."""
    commit = git_commit() if commit is None else commit
    code = code_tree() if code is None else code
    jobs = []
    for exp in experiments:
        if exp not in EXPERIMENTS:
            raise ValueError(f"unknown experiment {exp!r}; choose from {', '.join(EXPERIMENTS)}")
        n_trials = PROTOCOL.trials_for(exp) if trials is None else trials
        for var in EXPERIMENTS[exp]:
            for k in range(scenarios):
                for t in range(n_trials):
                    for p in policies:
                        jobs.append(Job(exp, var, seed * 1000 + k, t, p, minutes * 60.0, root_replicas, commit, code,
                                        server_model, request_timeout_s, deadline_shed, timeouts, admission, retry,
                                        admission_slowdown))
    return jobs


def run_job(job: Job) -> dict:
    """Simulate one job; returns its record (without the normalised fields) plus timing."""
    t0 = time.perf_counter()
    c0 = time.process_time()
    sc = generate(job.scenario, duration_s=job.duration_s, **job.scenario_kwargs())
    res = simulate(sc, job.policy, job.trial,
                   SimConfig(root_replicas=job.root_replicas, request_timeout_s=job.request_timeout_s,
                             deadline_shed=job.deadline_shed, timeouts=job.timeouts, admission=job.admission,
                             cross_cell_retry=job.retry, admission_slowdown=job.admission_slowdown))
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    s = res.summary()
    rec = {
        "experiment": job.experiment,
        "variant": job.variant.label,
        "x": job.variant.x,
        "policy": job.policy,
        "scenario": job.scenario,
        "trial": job.trial,
        "duration_s": job.duration_s,
        "root_replicas": job.root_replicas,
        "commit": job.commit,
        "code": job.code,
        "server_model": s["server_model"],
        "request_timeout_s": s["request_timeout_s"],
        "deadline_shed": job.deadline_shed,
        "admission": job.admission,
        "admission_refused_rate": s["admission_refused_rate"],
        "admission_slowdown": job.admission_slowdown,
        "retry": job.retry,
        "retried_rate": s["retried_rate"],
        "timeouts": s["timeouts"],
        **{m: s[m] for m in METRICS},
        "arrivals": s["arrivals"],
        "errors": s["errors"],
        "shed": s["shed"],
        "cancelled": s["cancelled"],
        "preemptions": s["preemptions"],
        "in_flight": s["in_flight"],
        "cells": sc.n,
        "net_mean": s["net_mean"],
        "events": s["events"],
        "wall_s": wall,
        "cpu_s": cpu,
    }
    return rec


def record_key(rec: dict) -> tuple:
    """:meth:`Job.key` of the job that made ``rec``."""
    return (rec["experiment"], rec["variant"], rec["policy"], rec["scenario"], rec["trial"], rec["duration_s"],
            rec.get("root_replicas", 1), rec.get("code", "unknown"), rec.get("server_model", _old_server_model(rec)),
            rec.get("timeouts", "serve"), float(rec["request_timeout_s"]), rec.get("deadline_shed", False),
            rec.get("admission", False), rec.get("retry", False),
            float(rec.get("admission_slowdown", 0.0)))  # records from before the floor ran the deadline-only rule


def _old_server_model(rec: dict) -> str:
    """The server model of a record that does not say: its variant's, else the default it ran with."""
    var = next((v for v in EXPERIMENTS.get(rec.get("experiment", ""), ()) if v.label == rec.get("variant")), None)
    return str(var.kwargs().get("server_model", "pipeline")) if var is not None else "pipeline"


#: Normalised figure → the record field it divides by Rand's: the failure-counting figures
#: (:mod:`dlb.sim.outcome`), and the success-only mean for reference.
NORMALISED = {"norm_mean": "mean_latency_with_failures", "norm_p90": "p90_latency_with_failures",
              "norm_mean_served": "mean"}


def normalise(records: list[dict]) -> list[dict]:
    """Add ``norm_mean``/``norm_p90`` (failed and shed requests at the timeout) and ``norm_mean_served``
    (success only): divided by Rand's value in the same scenario, trial, variant and server model.
    Records without the failure-counting fields are completed first (:func:`dlb.sim.outcome.complete`)."""
    for r in records:
        if r.get("experiment") in EXPERIMENTS and ("mean_latency_with_failures" not in r or "client_failure_rate" not in r):
            complete(r, server_model=_old_server_model(r))

    def key(r: dict) -> tuple:
        return (r["experiment"], r["variant"], r["scenario"], r["trial"], r.get("root_replicas", 1),
                r.get("server_model", "pipeline"))

    rand = {key(r): r for r in records if r["policy"] == "Rand"}
    for r in records:
        base = rand.get(key(r))
        for name, m in NORMALISED.items():
            b = float("nan") if base is None else float(base.get(m, math.nan))
            v = float(r.get(m, math.nan))
            r[name] = v / b if b > 0 and math.isfinite(b) else math.nan
    return records


def nan_for_null(records: list[dict]) -> list[dict]:
    """Records read back: a paper experiment's null figure (written for NaN, dlb.finite_json) is NaN again; the
    priors experiment's None stays (``converge_s``: never converged)."""
    for r in records:
        if r.get("experiment") in EXPERIMENTS:
            r.update({k: math.nan for k, v in r.items() if v is None})
    return records


class Progress:
    """A one-line progress bar on stderr (no dependency): done/total, elapsed, ETA."""

    def __init__(self, total: int, stream=sys.stderr, width: int = 30) -> None:
        self.total, self.stream, self.width = total, stream, width
        self.done = 0
        self.t0 = time.monotonic()
        self.enabled = total > 0
        self._draw("")

    def step(self, label: str = "") -> None:
        self.done += 1
        self._draw(label)

    def _draw(self, label: str) -> None:
        if not self.enabled:
            return
        el = time.monotonic() - self.t0
        frac = self.done / self.total
        eta = el / frac - el if frac > 0 else math.nan
        bar = "#" * int(self.width * frac) + "." * (self.width - int(self.width * frac))
        eta_s = f"{eta:5.0f}s" if math.isfinite(eta) else "    ?"
        self.stream.write(f"\r[{bar}] {self.done}/{self.total} {el:5.0f}s eta {eta_s} {label[:40]:<40}")
        if self.done == self.total:
            self.stream.write("\n")
        self.stream.flush()


def run_jobs(jobs: list[Job], workers: int = 1, progress: bool = True,
             on_record: Callable[[dict], None] | None = None, in_order: bool = False) -> list[dict]:
    """Run jobs (largest first, or in the given order) on ``workers`` processes; returns normalised records in job order.

    ``in_order``: as :func:`make_jobs` lists them, scenario by scenario, so a run stopped early (a
    deadline on a loaded machine) has whole scenarios, each with its Rand to normalise by.
    """
    order = list(range(len(jobs))) if in_order else sorted(range(len(jobs)), key=lambda k: -jobs[k].cost())
    bar = Progress(len(jobs)) if progress else None
    out: list[dict[str, Any] | None] = [None] * len(jobs)
    if workers <= 1:
        for k in order:
            rec = out[k] = run_job(jobs[k])
            if on_record:
                on_record(rec)
            if bar:
                bar.step(f"{jobs[k].experiment}/{jobs[k].variant.label}/{jobs[k].policy}")
    else:
        # fork: workers inherit the imported modules (fast start); the jobs share nothing mutable.
        ctx = get_context("fork" if sys.platform.startswith("linux") else "spawn")
        with ctx.Pool(workers, maxtasksperchild=50, initializer=ignore_sigint) as pool:
            for k, rec in pool.imap_unordered(_indexed, [(k, jobs[k]) for k in order], chunksize=1):
                out[k] = rec
                if on_record:
                    on_record(rec)
                if bar:
                    bar.step(f"{jobs[k].experiment}/{jobs[k].variant.label}/{jobs[k].policy}")
    return normalise([r for r in out if r is not None])


def _indexed(item: tuple[int, Job]) -> tuple[int, dict]:
    k, job = item
    return k, run_job(job)


def default_workers() -> int:
    return max(1, min(2, os.cpu_count() or 1))


def aggregate(records: list[dict]) -> dict[tuple[str, str, str], dict[str, float]]:
    """(experiment, variant, policy) → mean over scenarios×trials of the normalised metrics and errors."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for r in records:
        groups.setdefault((r["experiment"], r["variant"], r["policy"]), []).append(r)
    agg = {}
    for key, rs in groups.items():
        def col(m: str) -> np.ndarray:
            v = np.array([r.get(m, math.nan) for r in rs], float)  # noqa: B023 - called within this iteration
            return v[np.isfinite(v)]

        def avg(m: str) -> float:
            v = col(m)
            return float(v.mean()) if v.size else math.nan

        nm = col("norm_mean")
        agg[key] = {
            "norm_mean": float(nm.mean()) if nm.size else math.nan,
            "norm_mean_sd": float(nm.std()) if nm.size else math.nan,
            **{m: avg(m) for m in ("norm_p90", "norm_mean_served", "error_rate", "shed_rate", "timed_out_rate",
                                   "cancelled_rate", "client_failure_rate", "mean", "mean_latency_with_failures",
                                   "net_mean")},
            "n": len(rs),
            "x": float(rs[0].get("x", 0.0)),
        }
    return agg
