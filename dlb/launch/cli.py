"""``dlb up``: argument parsing only; the work is in :mod:`dlb.launch.up`."""

from __future__ import annotations

import argparse
from pathlib import Path

from dlb.ext_proc.cli import add_tracing_flags, tracing_options
from dlb.load.argtypes import positive_float


def register_up(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("up", help="run every DLB component of a config on this machine (supervised)",
                              description="Start the control plane, every cell's leaf Envoy + agent and every source "
                              "cell's root Envoy + service in front of the servers the config names; wait until every "
                              "tier is ready (probes fresh); print the URLs; restart crashed children; Ctrl-C stops all.")
    p.add_argument("--config", required=True, help="DLB config YAML (docs/config.md)")
    p.add_argument("--run-dir", type=Path, default=None, help="logs and bootstraps (default runs/up-TIMESTAMP)")
    p.add_argument("--emulate-wan", action="store_true", help="delay leaf traffic and probes by the config's one-way latencies")
    p.add_argument("--ready-timeout", type=positive_float, default=90.0, help="seconds each tier may take to become ready (default 90)")
    p.add_argument("--insecure", action="store_true",
                   help="no private CA: gRPC between the control plane, roots and leaves stays plaintext unless the config has tls")
    p.add_argument("--control-planes", type=int, default=2, choices=range(1, 6), metavar="N",
                   help="control-plane replicas (active-active; each Envoy and service streams from one and moves to another when it fails; default 2)")
    p.add_argument("--root-envoys", type=int, default=2, choices=range(1, 6), metavar="N",
                   help="root Envoys per source cell, sharing its address (a kill loses only their in-flight requests; default 2)")
    p.add_argument("--duration", type=positive_float, default=None, help="stop after this many seconds (default: until Ctrl-C)")
    add_tracing_flags(p, "root decision and leaf pick")
    p.set_defaults(func=_run_up)


def _run_up(args: argparse.Namespace) -> int:
    from dlb.launch.up import run_up

    opts = tracing_options(args, "dlb")  # checks the ratio before anything starts
    tracing = ["--otlp-endpoint", args.otlp_endpoint, "--trace-sample-ratio", str(opts.sample_ratio)] if args.otlp_endpoint else []
    return run_up(args.config, args.run_dir, args.emulate_wan, args.ready_timeout, args.duration, args.insecure, tracing,
                  control_planes=args.control_planes, root_envoys=args.root_envoys)
