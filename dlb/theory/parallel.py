"""Run the fluid-model check over many networks in worker processes (the I/O-free model is in ``fluid``).

Why a module of its own: process pools are runtime plumbing, not the model; a full ``dlb theory`` set
is ~2 h of 2-core time, so the jobs run one policy each, dearest first, in spawned workers.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from dlb.core.flow import FlowConfig
from dlb.resumable import ignore_sigint
from dlb.theory.equilibria import Equilibrium, FluidNetwork, Objective
from dlb.theory.fluid import Record, SimConfig, equilibria, rule_name, run


def job_key(rec: Record) -> tuple[str, int, float, str, str]:
    """What identifies a record's job: topology, R, ε, policy and flow delay rule."""
    return (rec.topology, rec.replicas, rec.noise, rec.policy, rec.rule)


def _rule(relaxation: bool) -> str:
    return rule_name(FlowConfig(relaxation_delay=relaxation))


def _run_one(job: tuple[FluidNetwork, SimConfig, list[str], float, dict[Objective, Equilibrium]]) -> list[Record]:
    net, cfg, policies, window, eqs = job
    return run([net], cfg, policies, window, {net.name: eqs})


def _solve_one(job: tuple[FluidNetwork, list[str]]) -> dict[Objective, Equilibrium]:
    return equilibria(*job)


def _job_cost(job: tuple[FluidNetwork, SimConfig, list[str], float, dict[Objective, Equilibrium]]) -> float:
    """Relative CPU cost of a job, to start the dearest first: the flow step and the probe bookkeeping
    are per router and per cell, so ~ n² · R (docs/theory.md, "Runtime")."""
    net, cfg = job[0], job[1]
    return float(net.n * net.n * cfg.root_replicas)


@dataclass(frozen=True)
class Sweep:
    """What one check runs on every network: policies × root replicas × model errors, and the averaging window."""

    policies: list[str]
    window: float
    replicas: tuple[int, ...] = (1,)
    noises: tuple[float, ...] = (0.0,)
    #: FlowConfig.relaxation_delay values to run (False: the delay-only rule).
    rules: tuple[bool, ...] = (FlowConfig().relaxation_delay,)


def run_parallel(nets: list[FluidNetwork], cfg: SimConfig, sweep: Sweep, jobs: int,
                 on_records: Callable[[list[Record]], None] | None = None, done: Sequence[Record] = ()) -> list[Record]:
    """:func:`~dlb.theory.fluid.run` over topologies × replicas × noise × policies in ``jobs`` worker processes.

    Results come back in (topology, R, ε, policy) order whatever order the jobs finished in.
    Each network's equilibria are solved once, not once per (R, ε): on the complete 12-cell graph the
    three solves take ~115 s of CPU, more than its R = 1 simulations (docs/theory.md, "Runtime").
    One job is one policy (a trajectory does not depend on the other policies), started dearest first:
    with one job per (topology, R, ε) the last C12 jobs ran ~14 min on one worker while the other idled.
    ``on_records`` is called with each job's records as it finishes (the CLI streams them to disk, so
    an interrupted 2-hour run keeps what it did); ``done``: records of an interrupted run, whose jobs
    are not run again (``dlb theory --resume``).
    """
    policies, window = sweep.policies, sweep.window
    work = [(net, r, e, p, q) for net in nets for r in sweep.replicas for e in sweep.noises for p in policies
            for q in sweep.rules]
    have = {job_key(rec) for rec in done}
    order = {(net.name, r, e, p, _rule(q)): k for k, (net, r, e, p, q) in enumerate(work)}
    work = [w for w in work if (w[0].name, w[1], w[2], w[3], _rule(w[4])) not in have]
    pool = multiprocessing.get_context("spawn").Pool(jobs, initializer=ignore_sigint) if jobs > 1 and len(work) > 1 else None
    try:
        need = [net for net in nets if any(w[0] is net for w in work)]  # a resumed run may have all of one
        if pool is not None:
            solved = pool.map(_solve_one, [(net, policies) for net in need], chunksize=1)
        else:
            solved = [_solve_one((net, policies)) for net in need]
        eqs = {net.name: s for net, s in zip(need, solved, strict=True)}
        todo = [(net, replace(cfg, root_replicas=r, noise_eps=e, flow=replace(cfg.flow, relaxation_delay=q)), [p], window,
                 eqs[net.name]) for net, r, e, p, q in work]
        todo.sort(key=_job_cost, reverse=True)
        results = pool.imap_unordered(_run_one, todo, chunksize=1) if pool is not None else map(_run_one, todo)
        out = [rec for rec in done if job_key(rec) in order]
        for recs in results:
            out += recs
            if on_records is not None:
                on_records(recs)
        return sorted(out, key=lambda rec: order[job_key(rec)])
    finally:
        if pool is not None:
            pool.terminate()
