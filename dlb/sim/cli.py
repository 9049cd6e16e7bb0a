"""``dlb sim``: run the paper's simulation experiments; ``dlb sim report``: write the reproduction report."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from dlb.sim.experiments import EXPERIMENTS, PROTOCOL, default_workers, git_commit, make_jobs, normalise, run_jobs
from dlb.sim.policies import POLICIES


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sim",
        help="run the paper's simulation experiments (discrete-event, production routing code)",
        description="Simulate DLB and the baselines on generated scenarios (paper Appendix B). "
        "Writes results.json, results.md and one PNG per experiment to --out.",
    )
    p.add_argument("--experiment", action="append", choices=[*EXPERIMENTS, "all", "priors"],
                   help="experiment to run (repeatable; 'all' = every paper experiment); default baseline. "
                   "'priors': time for the router to find the right cell after wrong priors, a leaf restart or a "
                   "3x slower cell, with and without learning (docs/simulator.md)")
    p.add_argument("--scenarios", type=int, default=PROTOCOL.scenarios,
                   help=f"scenarios per experiment (default {PROTOCOL.scenarios})")
    p.add_argument("--trials", type=int, default=None,
                   help=f"trials per scenario (default: the protocol's, {PROTOCOL.baseline_trials} for the baseline "
                   f"and {PROTOCOL.trials} for the others and for priors)")
    p.add_argument("--minutes", type=float, default=PROTOCOL.minutes,
                   help=f"simulated minutes per run (default {PROTOCOL.minutes:g})")
    p.add_argument("--seed", type=int, default=1, help="base seed; scenario k has seed 1000·seed + k")
    p.add_argument("--workers", type=int, default=default_workers(), help="worker processes (default: up to 2)")
    p.add_argument("--policies", default=",".join(POLICIES), help="comma-separated subset of policies (Rand is needed for normalisation)")
    p.add_argument("--variants", default=None,
                   help="comma-separated subset of variant labels (e.g. 'eps=0.0,eps=0.75'); default all")
    p.add_argument("--root-replicas", type=int, default=1,
                   help="root replicas per cell, each with its own probes and state; requests round-robin (default 1)")
    p.add_argument("--out", default="sim-results", help="output directory (default sim-results)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--estimate", type=float, default=None, metavar="MINUTES",
                   help="do not run the experiments: run each variant and policy once on one scenario for MINUTES "
                   "and project each experiment's CPU time at --scenarios/--trials/--minutes (dlb.sim.cost); "
                   "writes cost-estimate.json and .md to --out")
    p.add_argument("--in-order", action="store_true",
                   help="run scenario by scenario (default: largest jobs first); a run stopped early keeps whole "
                        "scenarios in OUT/partial-*.jsonl")
    p.set_defaults(func=run)
    sub = p.add_subparsers(dest="sim_command", metavar="SUBCOMMAND")
    r = sub.add_parser("report", help="write the paper-reproduction report from a results.json")
    r.add_argument("--results", action="append", default=None,
                   help="results file (repeatable: files are merged; default sim-results/results.json)")
    r.add_argument("--save-merged", default=None, help="write the merged, re-normalised records to this JSON file")
    r.add_argument("--output", default="docs/paper-reproduction.md", help="report path (default docs/paper-reproduction.md)")
    r.add_argument("--plots-dir", default=None, help="also write the plots here and link them (default: next to the report, sim-plots/)")
    r.add_argument("--analysis", default=None, help="Markdown file with the investigation of failed claims, included verbatim")
    r.set_defaults(func=run_report)


def _validate(args: argparse.Namespace) -> list[str]:
    for name in ("scenarios", "trials", "workers", "root_replicas"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise SystemExit(f"dlb sim: --{name.replace('_', '-')} must be >= 1")
    if not args.minutes > 0:
        raise SystemExit("dlb sim: --minutes must be > 0")
    pols = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in pols if p not in POLICIES]
    if bad:
        raise SystemExit(f"dlb sim: unknown policy in --policies: {', '.join(bad)} (choose from {', '.join(POLICIES)})")
    return pols


def run(args: argparse.Namespace) -> int:
    from dlb.sim.report import markdown_table, plot

    policies = _validate(args)
    exps = args.experiment or ["baseline"]
    if "all" in exps:
        exps = [e for e in exps if e == "priors"] + list(EXPERIMENTS)
    exps = list(dict.fromkeys(exps))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.estimate is not None:
        return run_estimate(args, [e for e in exps if e != "priors"], policies, out)
    if "priors" in exps:
        run_priors(args, policies, out)
        exps.remove("priors")
        if not exps:
            return 0
    jobs = make_jobs(exps, args.scenarios, args.trials, args.minutes, args.seed, policies, args.root_replicas)
    if args.variants:
        wanted = {v.strip() for v in args.variants.split(",") if v.strip()}
        known = {v.label for e in exps for v in EXPERIMENTS[e]}
        if wanted - known:
            raise SystemExit(f"dlb sim: unknown --variants {', '.join(sorted(wanted - known))} (known: {', '.join(sorted(known))})")
        jobs = [j for j in jobs if j.variant.label in wanted]
    commit = jobs[0].commit if jobs else git_commit()  # the code that produces the records
    t0 = time.perf_counter()
    # Records also stream to a JSONL file as runs finish, so an interrupted long run keeps its work.
    partial = out / f"partial-{'-'.join(exps)}.jsonl"
    with partial.open("w") as fh:
        def keep(rec: dict) -> None:
            rec["commit"] = commit
            fh.write(json.dumps(rec) + "\n")
            fh.flush()

        records = run_jobs(jobs, workers=args.workers, progress=not args.no_progress, on_record=keep, in_order=args.in_order)
    partial.unlink()
    wall = time.perf_counter() - t0
    # Keep results of other experiments already in the directory, so experiments can run separately.
    path = out / "results.json"
    kept: list[dict] = []
    if path.exists():
        try:
            kept = [r for r in json.loads(path.read_text()) if r.get("experiment") not in exps
                    and r.get("commit") == (jobs[0].commit if jobs else None)]
        except (OSError, json.JSONDecodeError):
            kept = []
    all_records = normalise(kept + records)
    path.write_text(json.dumps(all_records, indent=1, allow_nan=True))
    (out / "results.md").write_text(markdown_table(all_records) + "\n")
    plot(all_records, out)
    events = sum(r["events"] for r in records)
    cpu = sum(r["cpu_s"] for r in records)
    bench = {
        "commit": commit, "experiments": exps, "jobs": len(jobs), "workers": args.workers, "wall_s": wall,
        "events": events, "events_per_s_wall": events / wall if wall > 0 else math.nan,
        "cpu_s": cpu,
        "events_per_cpu_s": events / cpu if cpu > 0 else math.nan,
        "load_average": list(os.getloadavg()),
        "scenarios": args.scenarios, "trials": args.trials if args.trials is not None else {e: PROTOCOL.trials_for(e) for e in exps}, "minutes": args.minutes,
        "root_replicas": args.root_replicas,
    }
    (out / "benchmark.json").write_text(json.dumps(bench, indent=1))
    print(markdown_table(records))
    print(f"\n{len(jobs)} runs, {events} events in {wall:.1f} s wall ({bench['events_per_s_wall']:.0f} events/s; "
          f"{bench['events_per_cpu_s']:.0f} events per CPU-second; load average {bench['load_average'][0]:.1f}) → {path}", file=sys.stderr)
    return 0


def run_estimate(args: argparse.Namespace, exps: list[str], policies: list[str], out: Path) -> int:
    """``--estimate``: project each experiment's CPU time at the protocol from short runs (dlb.sim.cost)."""
    from dataclasses import asdict, replace

    from dlb.sim import cost

    if not args.estimate > 0:
        raise SystemExit("dlb sim: --estimate must be > 0 minutes")
    protocol = replace(PROTOCOL, scenarios=args.scenarios, minutes=args.minutes,
                       **({} if args.trials is None else {"trials": args.trials, "baseline_trials": args.trials}))
    commit = git_commit()
    t0, c0 = time.perf_counter(), time.process_time()
    est = cost.estimate(exps, args.seed, args.estimate, 0, policies, protocol, args.root_replicas, commit)
    table = cost.markdown(est)
    meta = {"commit": commit, "probe_minutes": args.estimate, "protocol": asdict(protocol),
            "root_replicas": args.root_replicas, "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
            "load_average": list(os.getloadavg()), "estimates": [asdict(e) for e in est]}
    (out / "cost-estimate.json").write_text(json.dumps(meta, indent=1))
    (out / "cost-estimate.md").write_text(f"# Projected cost at the protocol (commit {commit})\n\n{table}\n")
    print(table)
    return 0


def run_priors(args: argparse.Namespace, policies: list[str], out: Path) -> None:
    """The priors experiment (dlb.sim.priors): its records replace earlier priors records in results.json."""
    from dlb.sim import priors

    pols = tuple(p for p in policies if p in priors.POLICIES)
    if not pols:
        raise SystemExit(f"dlb sim: the priors experiment runs latency-model policies only ({', '.join(priors.POLICIES)})")
    kinds = priors.SCENARIOS
    if args.variants:
        wanted = {v.strip() for v in args.variants.split(",") if v.strip()}
        if wanted - set(kinds):
            raise SystemExit(f"dlb sim: unknown --variants {', '.join(sorted(wanted - set(kinds)))} for priors "
                             f"(known: {', '.join(kinds)})")
        kinds = tuple(k for k in kinds if k in wanted)
    commit = git_commit()  # before running: the code that produces the records
    t0, c0 = time.perf_counter(), time.process_time()
    trials = PROTOCOL.trials if args.trials is None else args.trials
    records = priors.run_experiment(args.scenarios, trials, args.minutes * 60.0, args.seed, pols, kinds)
    for r in records:
        r["commit"] = commit
    path = out / "results.json"
    kept: list[dict] = []
    if path.exists():
        try:
            kept = [r for r in json.loads(path.read_text()) if r.get("experiment") != "priors"]
        except (OSError, json.JSONDecodeError):
            kept = []
    path.write_text(json.dumps(normalise(kept + records), indent=1, allow_nan=True))
    table = priors.markdown(records)
    (out / "priors.md").write_text(f"# priors experiment\n\n{table}\n")
    meta = {"experiment": "priors", "runs": len(records), "wall_s": time.perf_counter() - t0,
            "cpu_s": time.process_time() - c0, "commit": commit, "scenarios": args.scenarios,
            "trials": trials, "minutes": args.minutes, "seed": args.seed}
    (out / "benchmark-priors.json").write_text(json.dumps(meta, indent=1))
    print(table)
    print(f"\n{len(records)} priors runs in {meta['wall_s']:.1f} s wall → {path}", file=sys.stderr)


def run_report(args: argparse.Namespace) -> int:
    from dlb.sim.report import check_one_build, load, plot, reproduction_report

    sources = args.results or ["sim-results/results.json"]
    records: list[dict] = []
    try:
        for src in sources:
            records += load(src)
    except ValueError as e:
        print(f"dlb sim report: {e}", file=sys.stderr)
        return 2
    try:
        check_one_build(records)
    except ValueError as e:
        print(f"dlb sim report: {e}", file=sys.stderr)
        return 2
    records = normalise(records)
    if args.save_merged:
        Path(args.save_merged).parent.mkdir(parents=True, exist_ok=True)
        Path(args.save_merged).write_text(json.dumps(records, indent=1))
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    plots_dir = Path(args.plots_dir) if args.plots_dir else output.parent / "sim-plots"
    plots_dir.mkdir(parents=True, exist_ok=True)
    plot(records, plots_dir)
    analysis = None
    if args.analysis:
        try:
            analysis = Path(args.analysis).read_text()
        except OSError as e:
            print(f"dlb sim report: cannot read --analysis file {args.analysis}: {e}", file=sys.stderr)
            return 2
    rel = plots_dir.relative_to(output.parent) if plots_dir.is_relative_to(output.parent) else plots_dir.resolve()
    shown = args.save_merged or ", ".join(sources)
    output.write_text(reproduction_report(records, shown, str(rel), analysis))
    print(f"wrote {output} and plots in {plots_dir}", file=sys.stderr)
    return 0
