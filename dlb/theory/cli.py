"""``dlb theory``: options, the resumable JSON output, progress and the verdict of the fluid-model check.

Why here: the model (``fluid``) and its solvers stay pure; files, printing and exits are the command's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from dlb.core.flow import FlowConfig
from dlb.errors import UsageError
from dlb.load.argtypes import float_arg
from dlb.resumable import json_lines
from dlb.theory import parallel
from dlb.theory.fluid import (
    BUFFER_RHO,
    POLICIES,
    SCALE_GRAPHS,
    SCALE_SIZES,
    Record,
    SimConfig,
    dynamics_network,
    format_table,
    networks,
    scale_networks,
    targets,
)
from dlb.theory.loop import loop_table


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UsageError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise UsageError(f"{flag}: values must be >= 1: {text!r}")
    return vals


def _floats(text: str, flag: str, bounds: str = "[0, 1)", ok: Callable[[float], bool] = lambda v: 0 <= v < 1) -> tuple[float, ...]:
    """Comma-separated numbers each within ``bounds`` (said as such when one is not: one message per option)."""
    try:
        vals = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UsageError(f"{flag}: expected comma-separated numbers, got {text!r}") from None
    if not vals or not all(ok(v) for v in vals):
        raise UsageError(f"{flag}: values must be in {bounds}: {text!r}")
    return vals


def _kappa(text: str) -> float:
    """argparse type of ``--kappa``: the flow step is stable only for κ in (0, π/2) (FlowConfig refused it with a traceback)."""
    v = float_arg(text)
    if not 0 < v < math.pi / 2:  # also NaN
        raise argparse.ArgumentTypeError(f"must be in (0, π/2 ≈ {math.pi / 2:.4f}), got {text}")
    return v


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "theory",
        help="fluid-model check: routers vs independently solved equilibria",
        description=(
            "Integrate the paper's delayed fluid model (section 4) on seeded random topologies under "
            "the six DLB policies with R root replicas per cell and exact or noisy models, driving the "
            "production RootRouter, and compare the end state with the optimum / Wardrop / RIF "
            "equilibria solved with scipy.optimize."
        ),
    )
    p.add_argument("--set", dest="topology_set", choices=("scale", "paper", "dynamics", "loop"), default="scale",
                   help="topology set: 'scale' = complete and sparse graphs of --sizes cells (default); "
                   "'paper' = --topologies random 3–6-cell, 70%%-dense graphs; 'dynamics' = a 2-cell case whose "
                   "queue relaxes far slower than the network answers, run under both flow delay rules; 'loop' = the "
                   "linearised flow loop's damping per queue relaxation time and lead rule (no simulation)")
    p.add_argument("--sizes", default=",".join(str(n) for n in SCALE_SIZES), help="cell counts of the scale set (default %(default)s)")
    p.add_argument("--graphs", default=",".join(g for g, _ in SCALE_GRAPHS), help="graphs of the scale set (default %(default)s)")
    p.add_argument("--load", default=None,
                   help="demand as fractions of capacity, e.g. 0.85,0.95 (default: scale and paper sets draw "
                   "60–85%%; dynamics 0.95)")
    p.add_argument("--topologies", type=int, default=12, help="number of random topologies of the paper set (default 12)")
    p.add_argument("--seed", type=int, default=0, help="seed of the topology generator (default 0)")
    p.add_argument("--horizon", type=float, default=SimConfig.horizon_s, help="simulated seconds per run (default %(default)s)")
    p.add_argument("--window", type=float, default=None, help="seconds at the end to average over (default 10%% of the horizon, >= 10)")
    p.add_argument("--policies", default=",".join(POLICIES), help="comma-separated subset of %(default)s")
    p.add_argument("--replicas", default="1,4,16", help="root replicas per cell to run (default %(default)s)")
    p.add_argument("--noise", default="0,0.25", help="model errors ε to run; 0 = exact (default %(default)s)")
    p.add_argument("--rule", choices=("relaxation", "delay-only", "both"), default=None,
                   help="flow step delay rule: τ̄ is network + probe delay (delay-only, the router's default) or "
                   "also counts the slowest queue's relaxation time (relaxation); default: both for the dynamics "
                   "set, the router's otherwise")
    p.add_argument("--kappa", type=_kappa, default=FlowConfig.kappa, help="flow step-size constant κ (default %(default)s)")
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default: min(2, CPUs))")
    p.add_argument("--json", dest="json_path", default=None,
                   help="write the records as a JSON list to FILE; while it runs, each record is appended to "
                   "FILE.partial.jsonl as its job finishes (removed once FILE is written)")
    p.add_argument("--resume", action="store_true",
                   help="with --json: keep the records an interrupted run of the same code and settings left in "
                   "FILE.partial.jsonl and run only the missing jobs (the default set is ~2 h of 2-core time)")
    p.set_defaults(func=run_cli, provenance_commit=None, provenance_code=None, command_line=None)  # dlb.cli fills them in


def _check_json_path(path: str) -> None:
    """Refuse a --json path that cannot be written, before hours of work rather than after."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(f"--json {path}: is a directory; give a file name")
    if not os.path.isdir(parent):
        raise UsageError(f"--json {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"--json {path}: directory {parent} is not writable")


def _resumed(partial: str, settings: dict[str, Any]) -> list[Record]:
    """Records of an interrupted run with the same settings (code included) in ``partial``; other lines
    (other settings, a line cut by the interruption) are skipped and counted on stderr."""
    kept: dict[tuple[str, int, float, str, str], Record] = {}
    skipped = 0
    fields = set(Record.__dataclass_fields__)
    try:
        for line, d in json_lines(partial):
            try:
                rec = Record(**{k: v for k, v in d.items() if k in fields}) if d.get("settings") == settings else None
            except (TypeError, AttributeError):
                rec = None
            if rec is not None:
                kept[parallel.job_key(rec)] = rec
            elif line.strip():
                skipped += 1
    except OSError as e:
        raise UsageError(f"--resume: cannot read {partial}: {e}") from None
    print(f"--resume: {len(kept)} record(s) kept from {partial}" + (f", {skipped} line(s) not" if skipped else ""),
          file=sys.stderr)
    return list(kept.values())


def print_loop() -> int:
    """``--set loop``: the linearised loop of :mod:`dlb.theory.loop`; exits 1 if the lag-aware lead does
    not damp every case (phase margin ≥ 40°, second half-cycle ≤ 0.2 of the first)."""
    rows = loop_table()
    print(f"{'T (s)':>7}  {'rule':15} {'lead (s)':>8} {'margin (deg)':>12} {'ring':>6}")
    for relax, name, lead, pm, ring in rows:
        print(f"{relax:7g}  {name:15} {lead:8.1f} {pm:12.1f} {ring:6.2f}")
    ok = all(pm >= 40 and ring <= 0.2 for relax, name, _, pm, ring in rows if name == "lag-aware lead" and relax >= 100)
    print(f"  {'PASS' if ok else 'FAIL'}  lag-aware lead: margin >= 40 deg and ring <= 0.2 for T >= 100 s")
    return 0 if ok else 1


def run_cli(args: argparse.Namespace) -> int:
    if args.topology_set == "loop":
        return print_loop()
    policies = [s.strip() for s in args.policies.split(",") if s.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise UsageError(f"--policies: unknown policy {unknown}; choose from {list(POLICIES)}")
    if args.topologies < 1 or args.horizon <= 0:
        raise UsageError("--topologies must be >= 1 and --horizon > 0")
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be >= 1, got {args.jobs}")
    if args.window is not None and not args.window > 0:
        raise UsageError(f"--window must be > 0 seconds, got {args.window:g}")
    replicas = _ints(args.replicas, "--replicas")
    noises = _floats(args.noise, "--noise")
    cfg = SimConfig(horizon_s=args.horizon, flow=FlowConfig(kappa=args.kappa))
    window = args.window if args.window is not None else max(10.0, 0.1 * args.horizon)
    if window >= args.horizon:
        raise UsageError(f"the averaging window ({window:g} s) must be shorter than --horizon ({args.horizon:g} s): "
                         "it would average the start from an empty system, not the end state (set a shorter --window "
                         "or a longer --horizon)")
    if args.resume and not args.json_path:
        raise UsageError("--resume needs --json FILE (the interrupted run's records are in FILE.partial.jsonl)")
    if args.json_path:
        _check_json_path(args.json_path)
    jobs = args.jobs if args.jobs is not None else min(2, os.cpu_count() or 1)
    loads = (_floats(args.load, "--load", f"(0, {BUFFER_RHO:g}) (the buffers fill at {BUFFER_RHO:g})", lambda v: 0 < v < BUFFER_RHO)
             if args.load is not None else None)
    graphs = tuple(g.strip() for g in args.graphs.split(",") if g.strip())
    known = [g for g, _ in SCALE_GRAPHS]
    if not graphs or any(g not in known for g in graphs):
        raise UsageError(f"--graphs: choose from {known}, got {args.graphs!r}")
    rules: tuple[bool, ...] = (FlowConfig().relaxation_delay,)
    if args.topology_set == "scale":
        sizes = _ints(args.sizes, "--sizes")
        if min(sizes) < 2:
            raise UsageError(f"--sizes: a network needs >= 2 cells (one cell has no routing to check): {args.sizes!r}")
        nets = scale_networks(args.seed, sizes, graphs, loads or (None,))
    elif args.topology_set == "dynamics":
        nets = [dynamics_network(x) for x in loads or (0.95,)]
        rules = (False, True)  # the delay-only rule and the shipped one, side by side
    elif loads is not None:
        raise UsageError("--load applies to the scale and dynamics sets")
    else:
        nets = networks(args.topologies, args.seed)
    if args.rule is not None:
        rules = {"relaxation": (True,), "delay-only": (False,), "both": (False, True)}[args.rule]
    commit = getattr(args, "provenance_commit", None) or "unknown"  # filled in by dlb.cli
    code = getattr(args, "provenance_code", None) or "unknown"
    settings = {"code": code, "set": args.topology_set, "sizes": args.sizes, "topologies": args.topologies,
                "seed": args.seed, "horizon": args.horizon, "window": window, "kappa": args.kappa,
                "graphs": args.graphs, "load": args.load, "rule": args.rule}
    start = time.monotonic()
    total = len(nets) * len(replicas) * len(noises) * len(policies) * len(rules)
    partial = f"{args.json_path}.partial.jsonl" if args.json_path else None
    done: list[Record] = []
    if partial and args.resume:
        if code == "unknown" or code.endswith("+dirty"):
            raise UsageError(f"--resume: the code is {code!r}; commit dlb/ first (a dirty tree has no id to resume onto)")
        done = _resumed(partial, settings)
    elif partial and os.path.exists(partial) and os.path.getsize(partial) > 0:
        raise UsageError(f"{partial} holds an interrupted run's records: continue it with --resume, or remove the file")
    if partial:
        with open(partial, "w", encoding="utf-8") as fh:  # rewritten with only what is kept
            for r in done:
                fh.write(json.dumps({**asdict(r), "commit": commit, "code": code, "settings": settings}) + "\n")
    finished = len(done)

    def progress(recs: list[Record]) -> None:
        # A full scale run takes ~1-2 h: say how far it is, and keep each record on disk as it comes.
        nonlocal finished
        finished += len(recs)
        for r in recs:
            print(f"[{finished}/{total}, {time.monotonic() - start:.0f} s] {r.topology} {r.policy} R={r.replicas} "
                  f"ε={r.noise:g} {r.rule}: latency_gap {100 * r.latency_gap:.3f}%", file=sys.stderr, flush=True)
        if partial:
            with open(partial, "a", encoding="utf-8") as fh:
                for r in recs:
                    fh.write(json.dumps({**asdict(r), "commit": commit, "code": code, "settings": settings}) + "\n")

    try:
        records = parallel.run_parallel(nets, cfg, parallel.Sweep(policies, window, replicas, noises, rules), jobs,
                                        on_records=progress, done=done)
    except KeyboardInterrupt:
        where = f"; the {finished} finished record(s) are in {partial}, continue with --resume" if partial else ""
        print(f"\ndlb theory: interrupted{where}", file=sys.stderr)
        return 130
    elapsed = time.monotonic() - start
    print(format_table(nets, records))
    print(f"\n{len(nets)} topologies ({args.topology_set}), seed {args.seed}, R {list(replicas)}, ε {list(noises)}, "
          f"horizon {args.horizon:g} s, κ = {args.kappa:g}, {elapsed:.1f} s")
    checks = targets(records)
    for name, holds, measured in checks:
        print(f"  {'PASS' if holds else 'FAIL'}  {name}: {measured}")
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as fh:
            # Each record carries the run's settings and command line, as the bench files do; still a list of records.
            command = getattr(args, "command_line", None)
            json.dump([{**asdict(r), "commit": commit, "code": code, "settings": settings, "command_line": command}
                       for r in records], fh, indent=1)
            fh.write("\n")
        if partial:
            os.unlink(partial)  # the complete file replaces it
    return 0 if all(h for _, h, _ in checks) else 1
