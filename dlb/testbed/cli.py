"""``dlb up`` and ``dlb demo``: argument parsing only; the work is in :mod:`dlb.testbed.up` and :mod:`dlb.testbed.demo`."""

from __future__ import annotations

import argparse
from pathlib import Path

from dlb.load.argtypes import positive_float


def register_up(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("up", help="run every DLB component of a config on this machine (supervised)",
                              description="Start the control plane, every cell's leaf Envoy + agent and every source "
                              "cell's root Envoy + service in front of the servers the config names; wait until every "
                              "tier is ready (probes fresh); print the URLs; restart crashed children; Ctrl-C stops all.")
    p.add_argument("--config", required=True, help="DLB config YAML (docs/config.md)")
    p.add_argument("--run-dir", type=Path, default=None, help="logs and bootstraps (default runs/up-TIMESTAMP)")
    p.add_argument("--emulate-wan", action="store_true", help="delay leaf traffic and probes by the config's one-way latencies")
    p.add_argument("--ready-timeout", type=positive_float, default=90.0, help="seconds each tier may take to become ready")
    p.add_argument("--duration", type=positive_float, default=None, help="stop after this many seconds (default: until Ctrl-C)")
    p.set_defaults(func=_run_up)


def _run_up(args: argparse.Namespace) -> int:
    from dlb.testbed.up import run_up

    return run_up(args.config, args.run_dir, args.emulate_wan, args.ready_timeout, args.duration)


def register_demo(subparsers: argparse._SubParsersAction) -> None:
    from dlb.testbed.demo import add_demo_arguments

    p = subparsers.add_parser("demo", help="the whole stack on an embedded emulated fleet, a workload and a live view")
    add_demo_arguments(p)
    p.set_defaults(func=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    """One demo run, or with ``--compare`` every policy in turn (:mod:`dlb.testbed.compare`)."""
    import sys
    import time

    from dlb.testbed.demo import run_once
    from dlb.testbed.report import git_commit
    from dlb.testbed.up import StopFlag

    git_commit()  # the tree as it is when the run starts
    out = args.out or Path("runs") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    stop = StopFlag().install()
    if args.compare:
        from dlb.testbed.compare import run_compare

        return run_compare(args, out, stop)
    live = not args.no_live and sys.stdout.isatty()
    _run, code = run_once(args, out, stop, live, args.policy, degrade=not args.no_degrade)
    return code
