"""``dlb serve epp``: its flags, checked and turned into :class:`~dlb.epp.serve.EppOptions`."""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

from dlb.errors import UsageError
from dlb.ext_proc.cli import add_tracing_flags

if TYPE_CHECKING:
    from dlb.config.model import Cell
    from dlb.epp.k8s import PoolRef


def pool_ref(args: argparse.Namespace, cell: Cell, where: str) -> PoolRef | None:
    """The InferencePool to follow: ``--pool-*`` flags over the cell's ``inference_pool``; None: the cell's servers."""
    from dlb.config.model import INFERENCE_POOL_GROUPS
    from dlb.epp.k8s import PoolRef, default_namespace

    conf = cell.inference_pool
    name = args.pool_name or (conf.name if conf else None)
    if name is None:
        if args.pool_namespace or args.pool_group:
            raise UsageError(f"--pool-namespace and --pool-group need --pool-name (or {where}: cells[{cell.index}].inference_pool)")
        return None
    group = args.pool_group or (conf.group if conf else "inference.networking.k8s.io")
    if group not in INFERENCE_POOL_GROUPS:
        raise UsageError(f"--pool-group must be one of: {', '.join(INFERENCE_POOL_GROUPS)}, got {group!r}")
    return PoolRef(name, args.pool_namespace or (conf.namespace if conf else None) or default_namespace(), group)


def run_epp(args: argparse.Namespace) -> int:
    from dlb.epp.limits import GrpcLimits
    from dlb.epp.serve import EppOptions, run_epp
    from dlb.ext_proc.cli import load_cell, tracing_options
    from dlb.service.runner import run_event_loop

    for flag, value in (("--drain-s", args.drain_s), ("--grace-s", args.grace_s), ("--dns-period-s", args.dns_period_s),
                        ("--scrape-period-ms", args.scrape_period_ms)):
        if not 0 <= value < math.inf:
            raise UsageError(f"{flag} must be >= 0 and finite, got {value}")
    try:
        limits = GrpcLimits(max_streams=args.max_streams, max_message_bytes=args.max_message_bytes)
    except ValueError as exc:
        raise UsageError(f"--{str(exc).replace('_', '-', 2)}") from None
    tracing = tracing_options(args, f"dlb-epp-{args.cell}")
    cfg, cell = load_cell(args.config, args.cell)
    if cell.leaf.foreign:  # the roots read what runs there (leaf.source), never this EPP's probe answers
        raise UsageError(f"dlb serve epp: {args.config}: cells[{cell.index}].leaf.source is {cell.leaf.source!r}: the roots "
                         f"read cell {cell.name!r}'s {cell.leaf.source} metrics, not an EPP's; for a pool this EPP serves, "
                         f"leave leaf.source at 'dlb' (its probe address is then the EPP's)")
    listen = args.listen or str(cell.leaf.ext_proc or cell.leaf.probe)
    pool = pool_ref(args, cell, args.config)
    run_event_loop(run_epp(cfg, EppOptions(
        cell=args.cell, listen=listen, metrics=args.metrics or None, ready_file=args.ready_file,
        scrape_period_s=args.scrape_period_ms / 1000.0, seed=args.seed, dns_period_s=args.dns_period_s,
        shed_when_full=args.shed_when_full, drain_s=args.drain_s, grace_s=args.grace_s, tracing=tracing,
        pool=pool, kubeconfig=args.kubeconfig, limits=limits)))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("epp", help="Gateway API Inference Extension endpoint picker for one pool (a cell's servers)")
    p.add_argument("--config", required=True, help="DLB config YAML; the pool: one cell's servers or inference_pool")
    p.add_argument("--cell", required=True, help="the cell whose servers form the InferencePool")
    p.add_argument("--listen", default=None,
                   help="gRPC host:port for ext_proc, health and probes (default: cells[].leaf.ext_proc, else cells[].leaf.probe)")
    p.add_argument("--metrics", default=None, help="Prometheus host:port (default: off)")
    p.add_argument("--ready-file", default=None, help="write {grpc, metrics, pid} JSON here once serving")
    p.add_argument("--scrape-period-ms", type=float, default=200.0, help="server /metrics scrape period (0 = off)")
    p.add_argument("--dns-period-s", type=float, default=5.0, help="re-resolve the pool's DNS names this often (0 = once)")
    p.add_argument("--shed-when-full", action="store_true",
                   help="answer 429 when every eligible endpoint's KV cache is full (default: queue there)")
    p.add_argument("--pool-name", default=None,
                   help="follow this InferencePool's ready pods (list + watch) instead of the cell's; needs dlb[k8s]")
    p.add_argument("--pool-namespace", default=None, help="the pool's namespace (default: the cell's, the pod's own, else default)")
    p.add_argument("--pool-group", default=None,
                   help="the InferencePool API group: inference.networking.k8s.io (v1, default) or inference.networking.x-k8s.io")
    p.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: the pod's service account)")
    p.add_argument("--max-streams", type=int, default=10_000,
                   help="ext_proc streams open at once (one per request in flight); past it RESOURCE_EXHAUSTED, the gateway's failureMode")
    p.add_argument("--max-message-bytes", type=int, default=4 * 1024 * 1024, help="largest gRPC message taken or sent (a body chunk)")
    add_tracing_flags(p, "pick")
    p.add_argument("--seed", type=int, default=None, help="RNG seed (pick tie-breaks; default random)")
    p.add_argument("--drain-s", type=float, default=1.0,
                   help="on SIGTERM: seconds of gRPC health NOT_SERVING before the listener closes (default %(default)s)")
    p.add_argument("--grace-s", type=float, default=600.0,
                   help="after the drain: seconds the streams in flight get to finish (a stream lasts its generation; "
                        "default: the endpoints' default timeout_s); a second SIGTERM ends it")
    p.set_defaults(func=run_epp)
