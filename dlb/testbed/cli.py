"""``dlb demo``: argument parsing only; the work is in :mod:`dlb.testbed.demo` (``dlb up`` is in :mod:`dlb.launch.cli`)."""

from __future__ import annotations

import argparse


def register_demo(subparsers: argparse._SubParsersAction) -> None:
    from dlb.testbed.demo import add_demo_arguments

    p = subparsers.add_parser("demo", help="the whole stack on an embedded emulated fleet, a workload and a live view")
    add_demo_arguments(p)
    p.set_defaults(func=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    """One demo run, or with ``--compare`` every policy in turn (:mod:`dlb.testbed.compare`)."""
    import sys
    import time
    from pathlib import Path

    from dlb.launch.up import StopFlag
    from dlb.testbed.demo import run_once
    from dlb.testbed.report import git_commit

    git_commit()  # the tree as it is when the run starts
    out = args.out or Path("runs") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    stop = StopFlag().install()
    if args.compare:
        from dlb.testbed.compare import run_compare

        return run_compare(args, out, stop)
    live = not args.no_live and sys.stdout.isatty()
    _run, code = run_once(args, out, stop, live, args.policy, degrade=not args.no_degrade)
    return code
