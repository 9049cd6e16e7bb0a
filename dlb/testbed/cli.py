"""``dlb demo``: argument parsing only; the work is in :mod:`dlb.testbed.demo` (``dlb up`` is in :mod:`dlb.launch.cli`)."""

from __future__ import annotations

import argparse

#: ``dlb demo --compare --trials`` when not given (a single demo run refuses any other value: it runs once).
DEFAULT_TRIALS = 3


def register_demo(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="the whole stack on an embedded emulated fleet, a workload and a live view")
    add_demo_arguments(p)
    p.set_defaults(func=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    """One demo run, or with ``--compare`` every policy in turn (:mod:`dlb.testbed.compare`)."""
    import sys
    import time
    from pathlib import Path

    from dlb.core.native_discrete import DEFAULT_PICK
    from dlb.errors import UsageError
    from dlb.launch.up import StopFlag
    from dlb.testbed.demo import run_once
    from dlb.testbed.report import git_commit

    if not args.compare:  # a --compare option on a single demo run was silently ignored
        given = [f for f, on in (("--quick", args.quick), ("--scenarios", args.scenarios is not None),
                                 ("--policies", args.policies is not None), ("--json", args.json is not None),
                                 ("--trials", args.trials != DEFAULT_TRIALS)) if on]
        if given:
            raise UsageError(f"{', '.join(given)}: only with --compare (a single demo runs one policy: --policy)")
    else:  # the other way round: options --compare would silently not use
        if args.policy is not None:
            raise UsageError("--policy: not with --compare (name its policies with --policies)")
        if args.quick:
            given = [f for f, on in (("--scenarios", args.scenarios is not None), ("--policies", args.policies is not None),
                                     ("--trials", args.trials != DEFAULT_TRIALS)) if on]
            if given:
                raise UsageError(f"{', '.join(given)}: not with --quick (it runs steady, 1 trial, its own policies)")
    if not args.compare and args.native_pick != DEFAULT_PICK and not (args.policy or "").endswith("-native"):
        raise UsageError(f"--native-pick {args.native_pick}: only with a *-native --policy")
    git_commit()  # the tree as it is when the run starts
    if args.duration is None:
        args.duration = 10.0 if args.compare and args.quick else 60.0
    out = args.out or Path("runs") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    stop = StopFlag().install()
    if args.compare:
        from dlb.testbed.compare import run_compare

        return run_compare(args, out, stop)
    live = not args.no_live and sys.stdout.isatty()
    _run, code = run_once(args, out, stop, live, args.policy, degrade=not args.no_degrade)
    return code


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    """The demo's options (``dlb demo --help``); :func:`dlb.testbed.demo.prepare` reads them."""
    from pathlib import Path

    from dlb.core.native_discrete import DEFAULT_PICK, PICKS
    from dlb.load.argtypes import output_file, positive_float, rng_seed
    from dlb.testbed.demo_run import ALL_POLICIES

    p.description = ("Start an emulated multi-region fleet and DLB in front of it (as `dlb up`), send open-loop "
                     "streaming OpenAI traffic at a fraction of capacity, degrade one cell mid-run, show it live "
                     "and write a report (report.md, PNGs, results.json).")
    p.add_argument("--duration", type=positive_float, default=None, help="seconds of load (default 60; 10 with --compare --quick)")
    p.add_argument("--policy", choices=ALL_POLICIES, default=None,
                   help="one policy for both endpoints: a baseline (Envoy alone routes) or a DLB policy "
                        "(default: chat Disc-Lat + affinity, completions Flow-Grad)")
    p.add_argument("--native-pick", choices=tuple(PICKS), default=DEFAULT_PICK,
                   help=f"the root Envoy's pick for the *-native policies (default {DEFAULT_PICK}; docs/config.md native-discrete)")
    p.add_argument("--config", default=None, help="your own DLB config: an emulator is started on every server address")
    p.add_argument("--out", type=Path, default=None, help="report folder (default runs/demo-TIMESTAMP)")
    p.add_argument("--no-live", action="store_true", help="plain progress lines instead of the live view")
    p.add_argument("--load", type=positive_float, default=0.75, help="offered load as a fraction of fleet capacity (default 0.75)")
    p.add_argument("--no-degrade", action="store_true", help="no mid-run degradation")
    p.add_argument("--degrade-cell", default=None, help="cell to degrade (default us-central1, or the config's second cell)")
    p.add_argument("--seed", type=rng_seed, default=1, help="workload seed (default 1)")
    p.add_argument("--ready-timeout", type=positive_float, default=120.0, help="seconds each tier may take to become ready (default 120)")
    p.add_argument("--compare", action="store_true",
                   help="every scenario's seeded workload against every policy, each run from a clean start; records in "
                        "OUT/records.jsonl (the same --out resumes), table in OUT/compare.md")
    p.add_argument("--scenarios", default=None, help="with --compare: comma-separated subset (default all six)")
    p.add_argument("--trials", type=int, default=DEFAULT_TRIALS, help=f"with --compare: runs per (scenario, policy) (default {DEFAULT_TRIALS})")
    p.add_argument("--quick", action="store_true", help="with --compare: steady, 1 trial, the operator baselines and Flow-Grad")
    p.add_argument("--json", type=output_file, default=None, help="with --compare: write the summary and every record here")
    p.add_argument("--policies", default=None, help="with --compare: comma-separated subset (default every policy but the *-native ones)")
    p.add_argument("--dp", type=int, default=0, metavar="G",
                   help="europe-west1's servers become data-parallel groups of G lock-step ranks whose leaf picks the "
                        "rank with BF-IO (docs/bfio.md); default off")


def stub_dns_main() -> None:
    """The netns testbed's DNS server (:func:`dlb.testbed.stub_dns.argv`): its address and zone (JSON) in ``argv``."""
    import json
    import sys

    from dlb.testbed.stub_dns import serve

    serve(sys.argv[1], json.loads(sys.argv[2]))
