"""``dlb sim``: run the paper's simulation experiments; ``dlb sim report``: write the reproduction report."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from dlb.core.admission import AdmissionConfig
from dlb.core.shedding import ShedConfig
from dlb.finite_json import dumps as json_dumps
from dlb.load.argtypes import output_dir, output_file, rng_seed
from dlb.provenance import code_tree
from dlb.sim import outdir
from dlb.sim.engine import SimConfig
from dlb.sim.experiments import (
    EXPERIMENTS,
    PROTOCOL,
    default_workers,
    git_commit,
    make_jobs,
    normalise,
    record_key,
    run_jobs,
)
from dlb.sim.outcome import DEFAULT_REQUEST_TIMEOUT_S, TIMEOUT_MODES
from dlb.sim.policies import DEFAULT_POLICIES, OPERATOR_BASELINES, POLICIES
from dlb.sim.scenario import DEFAULT_SERVER_MODEL, SERVER_MODELS


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sim",
        help="run the paper's simulation experiments (discrete-event, production routing code)",
        description="Simulate DLB and the baselines on generated scenarios (paper Appendix B). "
        "Writes results.json, results.md and one PNG per experiment (priors: priors.md) to --out.",
    )
    p.add_argument("--experiment", action="append", choices=[*EXPERIMENTS, "all", "priors"],
                   help="experiment to run (repeatable; 'all' = every experiment, priors included: the full protocol in one "
                   "command, each experiment timed and recorded with the commit in benchmark.json); default baseline. "
                   "'priors': time for the router to find the right cell after wrong priors, a leaf restart or a "
                   "3x slower cell, with and without learning (docs/simulator.md)")
    p.add_argument("--scenarios", type=int, default=PROTOCOL.scenarios,
                   help=f"scenarios per experiment (default {PROTOCOL.scenarios})")
    p.add_argument("--trials", type=int, default=None,
                   help=f"trials per scenario (default: the protocol's, {PROTOCOL.baseline_trials} for the baseline "
                   f"and {PROTOCOL.trials} for the others and for priors)")
    p.add_argument("--minutes", type=float, default=PROTOCOL.minutes,
                   help=f"simulated minutes per run (default {PROTOCOL.minutes:g})")
    p.add_argument("--seed", type=rng_seed, default=1, help="base seed; scenario k has seed 1000·seed + k (default 1)")
    p.add_argument("--workers", type=int, default=default_workers(), help="worker processes (default: up to 2)")
    p.add_argument("--policies", default=",".join(DEFAULT_POLICIES),
                   help="comma-separated policies (Rand is needed for normalisation; default: all, the operator "
                        "baselines " + ", ".join(OPERATOR_BASELINES) + " included)")
    p.add_argument("--variants", default=None,
                   help="comma-separated subset of variant labels (e.g. 'eps=0.0,eps=0.75'); default all")
    p.add_argument("--root-replicas", type=int, default=1,
                   help="root replicas per cell, each with its own probes and state; requests round-robin (default 1)")
    p.add_argument("--server-model", choices=SERVER_MODELS, default=DEFAULT_SERVER_MODEL,
                   help="server model of every variant that does not set its own (the server-model and leaf-pick "
                        "experiments do): batched (continuous batching, default) or pipeline (the paper's); "
                        "each record names the model it ran")
    p.add_argument("--request-timeout", type=float, default=DEFAULT_REQUEST_TIMEOUT_S, metavar="SECONDS",
                   help="what a client waits for one request: failed, shed and slower requests count at it in the "
                        "failure-counting latency figures, and a batched server queues no more than it serves within it "
                        f"(default {DEFAULT_REQUEST_TIMEOUT_S:g})")
    p.add_argument("--deadline-shed", choices=("on", "off"), default="on" if ShedConfig.deadline else "off",
                   help="DLB roots also answer 429 when every usable cell's latency model puts a request past "
                        "--request-timeout (the shed plugin's deadline; default %(default)s)")
    p.add_argument("--admission", choices=("on", "off"), default="on" if AdmissionConfig.enabled else "off",
                   help="DLB leaves answer 429 when the picked server would, by Little's law, keep a request past "
                        "a third of --request-timeout and --admission-slowdown × the server's uncongested stay "
                        "(dlb.core.admission; default %(default)s)")
    p.add_argument("--admission-slowdown", type=float, default=AdmissionConfig.slowdown, metavar="X",
                   help="leaf admission refuses only at a server X times slower than its own uncongested stay; 0: the "
                        "deadline alone decides (default %(default)g)")
    p.add_argument("--retry", choices=("on", "off"), default="on" if SimConfig.cross_cell_retry else "off",
                   help="DLB roots send a request a cell refused before serving it (full server, leaf admission, no "
                        "live server) once more, to their fallback cell, as the root Envoy's retry does (default %(default)s)")
    p.add_argument("--timeouts", choices=TIMEOUT_MODES, default="cancel",
                   help="a request unanswered at --request-timeout: cancel it wherever it is, freeing its server slot "
                        "(what Envoy's route timeout and the server's abort do; default) or serve it late (older runs)")
    p.add_argument("--out", default="sim-results", help="output directory (default sim-results)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--estimate", type=float, default=None, metavar="MINUTES",
                   help="do not run the experiments: run each variant and policy once on one scenario for MINUTES "
                   "and project each experiment's CPU time at --scenarios/--trials/--minutes (dlb.sim.cost); "
                   "writes cost-estimate.json and .md to --out")
    p.add_argument("--resume", action="store_true",
                   help="keep what an interrupted or earlier run of the same code (git tree of dlb/) left in --out: "
                        "experiments benchmark.json records as finished with the same settings are skipped, and "
                        "runs already in OUT/partial-*.jsonl are not run again (the full protocol is many hours "
                        "of 2-core time, see --estimate; this lets it run in pieces)")
    p.add_argument("--in-order", action="store_true",
                   help="run scenario by scenario (default: largest jobs first); a run stopped early keeps whole "
                        "scenarios in OUT/partial-*.jsonl")
    p.set_defaults(func=run)
    sub = p.add_subparsers(dest="sim_command", metavar="SUBCOMMAND")
    r = sub.add_parser("report", help="write the paper-reproduction report from a results.json")
    r.add_argument("--results", action="append", default=None,
                   help="results file (repeatable: files are merged; default sim-results/results.json)")
    r.add_argument("--save-merged", type=output_file, default=None, help="write the merged, re-normalised records to this JSON file")
    r.add_argument("--output", type=output_file, default=None,
                   help="report path (default: paper-reproduction.md beside the first --results file, so a run from the "
                        "repository root does not overwrite research/paper-reproduction.md)")
    r.add_argument("--plots-dir", type=output_dir, default=None, help="also write the plots here and link them (default: next to the report, sim-plots/)")
    r.add_argument("--analysis", default=None, help="Markdown file with the investigation of failed claims, included verbatim")
    r.set_defaults(func=run_report)


def _validate(args: argparse.Namespace) -> list[str]:
    for name in ("scenarios", "trials", "workers", "root_replicas"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise SystemExit(f"dlb sim: --{name.replace('_', '-')} must be >= 1")
    if not args.minutes > 0:
        raise SystemExit("dlb sim: --minutes must be > 0")
    if not args.request_timeout > 0:
        raise SystemExit("dlb sim: --request-timeout must be > 0")
    if not (0 <= args.admission_slowdown <= 100):  # also NaN
        raise SystemExit("dlb sim: --admission-slowdown must be in [0, 100] (0: the deadline alone)")
    pols = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in pols if p not in POLICIES]
    if bad:
        raise SystemExit(f"dlb sim: unknown policy in --policies: {', '.join(bad)} (choose from {', '.join(POLICIES)})")
    twice = sorted({p for p in pols if pols.count(p) > 1})
    if twice:
        raise SystemExit(f"dlb sim: --policies names {', '.join(twice)} twice")
    if "Rand" not in pols:
        # Every "× Rand" figure (norm mean, the report's verdicts) divides by Rand's run of the same requests.
        print("dlb sim: --policies has no Rand: the normalised figures (norm mean, × Rand) will be n/a", file=sys.stderr)
    return pols


def run(args: argparse.Namespace) -> int:
    """Run the experiments one after another, each timed on its own (wall and CPU), all from one commit.

    ``all`` is every experiment, priors included: the one command of the full protocol. Each experiment's
    records go into ``results.json`` as soon as it finishes (so a 7-hour run stopped half-way keeps
    whole experiments), and ``benchmark.json`` gets its wall time, CPU time, runs and commit.
    """
    policies = _validate(args)
    exps = args.experiment or ["baseline"]
    if "all" in exps:
        exps = ["priors", *EXPERIMENTS]
    exps = list(dict.fromkeys(exps))
    wanted = _wanted_variants(args, exps)  # before --out is made: a refused label left an empty folder
    out = Path(args.out)
    try:
        outdir.prepare(out)
    except outdir.OutDirError as e:
        raise SystemExit(f"dlb sim: {e}") from None
    if args.estimate is not None:
        return run_estimate(args, [e for e in exps if e != "priors"], policies, out)
    commit = git_commit()  # once, as the run starts: the code that produces every record of it
    code = code_tree()
    if args.resume and (code == "unknown" or code.endswith("+dirty")):
        raise SystemExit(f"dlb sim --resume: the code is {code!r}; commit dlb/ first (a dirty tree has no id to resume onto)")
    # Entries of this build stay in benchmark.json, as their records stay in results.json.
    entries = outdir.benchmark_entries(out, code, warn=args.resume)
    plan: dict[str, dict] = {}
    for exp in exps:
        labels = set(priors_kinds()) if exp == "priors" else {v.label for v in EXPERIMENTS[exp]}
        if wanted is None or labels & wanted:  # else --variants names none of this experiment's
            plan[exp] = _settings(args, exp, policies, None if wanted is None else labels & wanted)
    if args.resume and (clash := _resume_clash(out, code, entries, plan)):
        print(f"dlb sim --resume: {clash}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    current = None
    try:
        for exp, settings in plan.items():
            done = entries.get(exp)
            if args.resume and done is not None and done.get("settings") == settings and outdir.has_results(out, exp, code):
                print(f"{exp}: finished earlier with this code and these settings; kept (--resume)", file=sys.stderr)
                continue
            current = exp
            if exp == "priors":
                entries[exp] = run_priors(args, policies, out, commit, code, wanted)
            else:
                entries[exp] = _run_paper_experiment(args, exp, policies, out, commit, code, wanted)
            current = None
            entries[exp]["settings"] = settings
            _write_benchmark(args, out, commit, code, entries, time.perf_counter() - started)
    except KeyboardInterrupt:
        where = f"; the runs that finished are in {outdir.partial_path(out, current)}" if current and current != "priors" else ""
        finished = f"Finished experiments are in {out / outdir.RESULTS}; " if (out / outdir.RESULTS).exists() else ""
        print(f"\ndlb sim: interrupted{where}. {finished}continue with the same command and --resume.", file=sys.stderr)
        return 130
    except outdir.OutDirError as e:
        raise SystemExit(f"dlb sim: {e}") from None
    return 0


def _settings(args: argparse.Namespace, exp: str, policies: list[str], labels: set[str] | None) -> dict:
    """What must match for ``--resume`` to keep an experiment's finished records (``labels``: this
    experiment's variants that ``--variants`` selected, None for all)."""
    trials = args.trials if args.trials is not None else PROTOCOL.trials_for(exp)
    return {"scenarios": args.scenarios, "trials": trials, "minutes": args.minutes, "seed": args.seed,
            "root_replicas": args.root_replicas, "policies": sorted(policies), "server_model": args.server_model,
            "request_timeout_s": args.request_timeout, "deadline_shed": args.deadline_shed == "on",
            "admission": args.admission == "on", "retry": args.retry == "on", "timeouts": args.timeouts,
            "admission_slowdown": args.admission_slowdown,
            "variants": sorted(labels) if labels is not None else None}


#: ``_settings`` keys whose option is not the key with dashes.
_OPTION_OF = {"request_timeout_s": "request-timeout"}


def _resume_clash(out: Path, code: str, entries: dict[str, dict], plan: dict[str, dict]) -> str | None:
    """Why ``--resume`` must not run ``plan`` over ``out`` (None: it may): an experiment finished there with
    other settings would have its records replaced, and a resume is meant to keep them."""
    for exp, settings in plan.items():
        stored = (entries.get(exp) or {}).get("settings")
        if not isinstance(stored, dict) or stored == settings or not outdir.has_results(out, exp, code):
            continue
        diff = [f"--{_OPTION_OF.get(k, k.replace('_', '-'))} {stored.get(k)!r} there, {settings.get(k)!r} now"
                for k in sorted(set(stored) | set(settings)) if stored.get(k) != settings.get(k)]
        return (f"{out / outdir.RESULTS} holds {exp} runs made with other settings ({'; '.join(diff)}); resuming would "
                "replace them: repeat those options, or give another --out")
    return None


def priors_kinds() -> tuple[str, ...]:
    from dlb.sim import priors

    return priors.SCENARIOS


def _wanted_variants(args: argparse.Namespace, exps: list[str]) -> set[str] | None:
    """``--variants`` as a set (None: all), refused when a label belongs to none of the experiments."""
    if not args.variants:
        return None
    wanted = {v.strip() for v in args.variants.split(",") if v.strip()}
    known = {v.label for e in exps if e in EXPERIMENTS for v in EXPERIMENTS[e]}
    if "priors" in exps:
        known |= set(priors_kinds())
    if wanted - known:
        raise SystemExit(f"dlb sim: unknown --variants {', '.join(sorted(wanted - known))} (known: {', '.join(sorted(known))})")
    return wanted


def _run_paper_experiment(args: argparse.Namespace, exp: str, policies: list[str], out: Path, commit: str, code: str,
                          wanted: set[str] | None) -> dict:
    """One paper experiment: run its jobs, merge its records into results.json; returns its timing.

    Records stream to ``OUT/partial-<exp>.jsonl`` as runs finish, so an interrupted run keeps its work
    and ``--resume`` runs only what is missing; the wall time is then the sum over the pieces.
    """
    from dlb.sim.report import markdown_table, plot

    jobs = make_jobs([exp], args.scenarios, args.trials, args.minutes, args.seed, policies, args.root_replicas, commit,
                     code, args.server_model, args.request_timeout, args.deadline_shed == "on", args.timeouts,
                     args.admission == "on", args.retry == "on", args.admission_slowdown)  # fmt: skip
    if wanted is not None:
        jobs = [j for j in jobs if j.variant.label in wanted]
    partial = outdir.partial_path(out, exp)
    earlier = outdir.read_partial(out, exp, jobs, code) if args.resume else []
    if earlier:
        have = {record_key(r) for r in earlier}
        print(f"{exp}: {len(earlier)} of {len(jobs)} runs kept from {partial} (--resume)", file=sys.stderr)
        todo = [j for j in jobs if j.key() not in have]
    else:
        todo = jobs
    started = time.time()
    try:
        fh = partial.open("w", encoding="utf-8")
    except OSError as e:
        raise outdir.OutDirError(f"{partial}: cannot write it: {e.strerror or e}") from e
    with fh:
        for r in earlier:  # rewritten with only what is kept: the file never holds another build's lines
            fh.write(json.dumps(r) + "\n")
        fh.flush()

        def keep(rec: dict) -> None:
            rec["piece_started_at"], rec["finished_at"] = started, time.time()
            fh.write(json.dumps(rec) + "\n")
            fh.flush()

        fresh = run_jobs(todo, workers=args.workers, progress=not args.no_progress, on_record=keep, in_order=args.in_order)
    records = normalise(earlier + fresh)
    wall, pieces = outdir.pieces_wall(records)
    path = out / outdir.RESULTS
    all_records = normalise(outdir.results_of(out, code, drop_experiment=exp) + records)
    path.write_text(json_dumps(all_records, indent=1))
    partial.unlink()  # only now: its records are in results.json
    (out / "results.md").write_text(markdown_table(all_records) + "\n")
    plot(all_records, out)
    events = sum(r["events"] for r in records)
    cpu = sum(r["cpu_s"] for r in records)
    trials = args.trials if args.trials is not None else PROTOCOL.trials_for(exp)
    print(markdown_table(records))
    print(f"\n{exp}: {len(jobs)} runs ({len(todo)} now), {events} events in {wall:.1f} s wall over {pieces} piece(s), "
          f"{cpu:.1f} CPU-s ({events / cpu if cpu > 0 else math.nan:.0f} events per CPU-second) → {path}", file=sys.stderr)
    return {"runs": len(jobs), "wall_s": wall, "pieces": pieces, "cpu_s": cpu, "events": events,
            "events_per_cpu_s": events / cpu if cpu > 0 else math.nan, "commit": commit, "code": code,
            "commits": sorted({str(r.get("commit")) for r in records}), "scenarios": args.scenarios, "trials": trials, "minutes": args.minutes,
            "protocol": PROTOCOL.met_by(exp, args.scenarios, trials, args.minutes)}


def _write_benchmark(args: argparse.Namespace, out: Path, commit: str, code: str, per_exp: dict[str, dict],
                     invocation_wall: float) -> None:  # fmt: skip
    """benchmark.json: totals and, per experiment, wall and CPU time, runs and commit (the ≤ 90-min check).

    Totals are over every experiment of this build in the directory, each timed over the pieces it ran
    in; ``invocation_wall_s`` is this command's own wall time.
    """
    events = sum(t.get("events", 0) for t in per_exp.values())
    cpu = sum(t.get("cpu_s", 0.0) for t in per_exp.values())
    wall = sum(t.get("wall_s", 0.0) for t in per_exp.values())
    bench = {
        "commit": commit, "code": code, "experiments": list(per_exp), "jobs": sum(t.get("runs", 0) for t in per_exp.values()),
        "workers": args.workers, "wall_s": wall, "invocation_wall_s": invocation_wall, "events": events,
        "events_per_s_wall": events / wall if wall > 0 else math.nan, "cpu_s": cpu,
        "events_per_cpu_s": events / cpu if cpu > 0 else math.nan, "load_average": list(os.getloadavg()),
        "scenarios": args.scenarios, "minutes": args.minutes, "root_replicas": args.root_replicas,
        "per_experiment": per_exp,
    }
    (out / outdir.BENCHMARK).write_text(json_dumps(bench, indent=1))


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
    est = cost.estimate(exps, args.seed, args.estimate, 0, policies, protocol, args.root_replicas, commit,
                        args.server_model)
    table = cost.markdown(est)
    meta = {"commit": commit, "probe_minutes": args.estimate, "protocol": asdict(protocol),
            "root_replicas": args.root_replicas, "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
            "load_average": list(os.getloadavg()), "estimates": [asdict(e) for e in est]}
    (out / "cost-estimate.json").write_text(json_dumps(meta, indent=1))
    (out / "cost-estimate.md").write_text(f"# Projected cost at the protocol (commit {commit})\n\n{table}\n")
    print(table)
    return 0


def run_priors(args: argparse.Namespace, policies: list[str], out: Path, commit: str, code: str,
               wanted: set[str] | None = None) -> dict:
    """The priors experiment (dlb.sim.priors): its records replace earlier priors records in results.json;
    returns its timing (wall and CPU time — it runs in this process — runs and commit)."""
    from dlb.sim import priors

    pols = tuple(p for p in policies if p in priors.POLICIES)
    if not pols:
        raise SystemExit(f"dlb sim: the priors experiment runs latency-model policies only ({', '.join(priors.POLICIES)})")
    kinds = priors.SCENARIOS if wanted is None else tuple(k for k in priors.SCENARIOS if k in wanted)
    t0, c0 = time.perf_counter(), time.process_time()
    trials = PROTOCOL.trials if args.trials is None else args.trials
    records = priors.run_experiment(args.scenarios, trials, args.minutes * 60.0, args.seed, pols, kinds)
    for r in records:
        r["commit"], r["code"] = commit, code
    path = out / outdir.RESULTS
    path.write_text(json_dumps(normalise(outdir.results_of(out, code, drop_experiment="priors") + records), indent=1))
    table = priors.markdown(records)
    (out / "priors.md").write_text(f"# priors experiment\n\n{table}\n")
    meta = {"experiment": "priors", "runs": len(records), "wall_s": time.perf_counter() - t0,
            "cpu_s": time.process_time() - c0, "commit": commit, "code": code, "scenarios": args.scenarios,
            "trials": trials, "minutes": args.minutes, "seed": args.seed,
            "protocol": PROTOCOL.met_by("priors", args.scenarios, trials, args.minutes)}
    (out / "benchmark-priors.json").write_text(json_dumps(meta, indent=1))
    print(table)
    print(f"\n{len(records)} priors runs in {meta['wall_s']:.1f} s wall → {path}", file=sys.stderr)
    return meta


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
    records, dropped = outdir.dedupe(records)
    if dropped:
        print(f"dlb sim report: {dropped} record(s) of runs already read were dropped (a file given twice, or "
              "files that overlap)", file=sys.stderr)  # fmt: skip
    try:
        check_one_build(records)
    except ValueError as e:
        print(f"dlb sim report: {e}", file=sys.stderr)
        return 2
    records = normalise(records)
    output = Path(args.output) if args.output else Path(sources[0]).parent / "paper-reproduction.md"
    plots_dir = Path(args.plots_dir) if args.plots_dir else output.parent / "sim-plots"
    try:
        if args.save_merged:
            Path(args.save_merged).parent.mkdir(parents=True, exist_ok=True)
            Path(args.save_merged).write_text(json_dumps(records, indent=1))
        output.parent.mkdir(parents=True, exist_ok=True)
        plots_dir.mkdir(parents=True, exist_ok=True)
        plot(records, plots_dir)
    except OSError as e:
        print(f"dlb sim report: cannot write {e.filename or output}: {e.strerror or e}", file=sys.stderr)
        return 2
    analysis = None
    if args.analysis:
        try:
            analysis = Path(args.analysis).read_text()
        except OSError as e:
            print(f"dlb sim report: cannot read --analysis file {args.analysis}: {e}", file=sys.stderr)
            return 2
    rel = plots_dir.relative_to(output.parent) if plots_dir.is_relative_to(output.parent) else plots_dir.resolve()
    shown = args.save_merged or ", ".join(sources)
    try:
        output.write_text(reproduction_report(records, shown, str(rel), analysis))
    except OSError as e:
        print(f"dlb sim report: cannot write {output}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"wrote {output} and plots in {plots_dir}", file=sys.stderr)
    return 0
