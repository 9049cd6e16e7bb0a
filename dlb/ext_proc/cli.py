"""``dlb serve root`` and ``dlb serve leaf``: their flags, checked and turned into options objects.

Why here: commands (argparse, exit codes) live only in each package's ``cli.py``; the services take a
:class:`~dlb.ext_proc.root_serve.RootOptions` / :class:`~dlb.ext_proc.leaf_serve.LeafOptions` and raise
:class:`~dlb.errors.DlbError` subclasses, which only ``dlb.cli.main`` turns into an exit. The service
modules are imported when a command runs, so ``dlb serve leaf --help`` loads neither service.
"""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

from dlb.errors import UsageError
from dlb.transport.limits import FD_RESERVE, H2Limits

if TYPE_CHECKING:  # pragma: no cover
    from dlb.config import Cell, Config
    from dlb.service.tracing import TracingOptions


def add_tracing_flags(p: argparse.ArgumentParser, what: str) -> None:
    """``--otlp-endpoint`` and ``--trace-sample-ratio`` (every service that can trace takes the same two)."""
    p.add_argument("--otlp-endpoint", default=None, help=f"OTLP/gRPC collector host:port: a span per {what} (default: tracing off)")
    p.add_argument("--trace-sample-ratio", type=float, default=None,
                   help="share of traces sampled when the request's traceparent does not decide (default 0.01; "
                        "needs --otlp-endpoint)")


def tracing_options(args: argparse.Namespace, service_name: str) -> TracingOptions:
    from dlb.config import parse_hostport
    from dlb.service.tracing import TracingOptions, sample_ratio

    ratio = sample_ratio(args)
    if args.otlp_endpoint and parse_hostport(args.otlp_endpoint) is None:  # before anything starts (dlb up started its children first)
        raise UsageError(f"--otlp-endpoint: {args.otlp_endpoint!r} is not host:port")
    try:
        return TracingOptions(args.otlp_endpoint, ratio, service_name=service_name)
    except ValueError as exc:
        raise UsageError(f"--trace-sample-ratio: {exc}") from None


def load_cell(config_path: str, cell_name: str) -> tuple[Config, Cell]:
    """The config and one of its cells for a service's command line.

    Raises :class:`~dlb.config.ConfigError` (every problem, with file:line) for bad input; the
    command line (``dlb.cli.main``) prints it and exits.
    """
    from dlb.config import ConfigError, load_config
    from dlb.config.loader import Problem

    try:
        cfg = load_config(config_path)
    except OSError as exc:
        raise ConfigError([Problem(config_path, "", exc.strerror or str(exc))]) from None
    if cell_name not in cfg.cell_names:  # the option the user typed, not a field of the file (it named the file twice)
        raise ConfigError([Problem(config_path, "--cell", f"no cell named {cell_name!r} (cells: {', '.join(cfg.cell_names)})")])
    return cfg, cfg.cell(cell_name)


def run_root(args: argparse.Namespace) -> int:
    import resource

    from dlb.ext_proc.root_serve import RootOptions, run_root
    from dlb.service.runner import die_with_parent, run_event_loop

    if args.config is None and args.xds is None:
        raise UsageError("dlb serve root: give --config FILE, --xds HOST:PORT, or both")
    if args.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {args.workers}")
    if not 0 <= args.drain_s < math.inf:  # nan would skip the drain, inf never close the listener
        raise UsageError(f"--drain-s must be >= 0 and finite, got {args.drain_s}")
    try:
        limits = H2Limits(max_connections=args.max_connections, max_concurrent_streams=args.max_concurrent_streams,
                          handshake_timeout_s=args.handshake_timeout_s, idle_timeout_s=args.idle_timeout_s,
                          max_connections_per_peer=args.max_connections_per_peer, first_stream_timeout_s=args.first_stream_timeout_s)
    except ValueError as exc:  # named by field: H2Limits.max_concurrent_streams -> --max-concurrent-streams
        field_name = str(exc).split()[0].removeprefix("H2Limits.")
        raise UsageError(f"--{field_name.replace('_', '-')}{str(exc).removeprefix('H2Limits.' + field_name)}") from None
    soft_fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft_fds != resource.RLIM_INFINITY and args.max_connections > soft_fds - FD_RESERVE:
        # the cap would never be reached: accept() fails with EMFILE first, and probes, xDS and /metrics with it
        raise UsageError(f"--max-connections must be <= {soft_fds - FD_RESERVE} (the file-descriptor limit {soft_fds} "
                         f"minus {FD_RESERVE} kept for probes, xDS and metrics; raise ulimit -n), got {args.max_connections}")
    cfg = None
    if args.config is not None:
        cfg, cell = load_cell(args.config, args.cell)
        listen = args.listen or str(cell.root.ext_proc or cfg.services.root.ext_proc)
        metrics = args.metrics
        if metrics is None:
            m = cfg.services.root.metrics
            metrics = f"{m.host}:{m.port + cell.index}"  # one metrics port per root on a shared host
    else:
        if args.listen is None:
            raise UsageError("dlb serve root: --listen is required without --config")
        listen, metrics = args.listen, args.metrics or None
    if args.worker_index > 0:
        die_with_parent()
    seed = None if args.seed is None else args.seed + args.worker_index
    run_event_loop(run_root(cfg, RootOptions(
        cell=args.cell, listen=listen, metrics=metrics or None, ready_file=args.ready_file, seed=seed, emulate_wan=args.emulate_wan,
        workers=args.workers, worker_index=args.worker_index, xds=args.xds, xds_delta=args.xds_delta, transport=args.transport,
        limits=limits, drain_s=args.drain_s, tracing=tracing_options(args, f"dlb-root-{args.cell}"))))
    return 0


def register_root(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("root", help="root ext_proc service: picks a cell per request (Envoy ExternalProcessor)")
    p.add_argument("--config", default=None, help="DLB config YAML (optional with --xds: then only the starting point)")
    p.add_argument("--cell", required=True, help="the cell this root serves (source of its traffic)")
    p.add_argument("--xds", default=None, help="control plane host:port: take (and follow) the routing config over xDS")
    p.add_argument("--xds-delta", action="store_true", help="use incremental xDS with the control plane")
    p.add_argument("--listen", default=None, help="gRPC host:port (default: cells[].root.ext_proc, else services.root.ext_proc)")
    p.add_argument("--metrics", default=None,
                   help="Prometheus host:port ('' = off; default services.root.metrics with port + cell index)")
    p.add_argument("--ready-file", default=None, help="write {ext_proc, metrics, pid} JSON here once serving")
    p.add_argument("--seed", type=int, default=None, help="RNG seed (tie-breaks, aversion, flow sampling)")
    p.add_argument("--workers", type=int, default=1,
                   help="processes sharing the port (SO_REUSEPORT); worker k serves metrics on the metrics port + 100k")
    p.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--transport", choices=("h2", "grpc"), default="h2",
                   help="ext_proc server: h2 = DLB's asyncio HTTP/2 gRPC server (default; a fraction of grpc.aio's CPU "
                        "and latency, measured in docs/data-plane.md), grpc = grpc.aio")
    d = H2Limits()
    p.add_argument("--max-connections", type=int, default=d.max_connections,
                   help="h2 transport: connections served at once, more are closed at accept "
                        f"(0 = min(4096, file-descriptor limit - {FD_RESERVE}); at most the limit - {FD_RESERVE})")
    p.add_argument("--max-connections-per-peer", type=int, default=d.max_connections_per_peer,
                   help="h2 transport: connections from one address (0 = a quarter of the cap, at least 64); at either cap a "
                        "connection that has opened no stream gives way to the new one")
    p.add_argument("--first-stream-timeout-s", type=float, default=d.first_stream_timeout_s,
                   help="h2 transport: a connection that opens no stream this long after accept is closed "
                        "(default %(default)s; >= --handshake-timeout-s)")
    p.add_argument("--max-concurrent-streams", type=int, default=d.max_concurrent_streams,
                   help="h2 transport: SETTINGS_MAX_CONCURRENT_STREAMS per connection; more get REFUSED_STREAM (default %(default)s)")
    p.add_argument("--handshake-timeout-s", type=float, default=d.handshake_timeout_s,
                   help="h2 transport: seconds from accept for a new connection to finish the TLS handshake (with tls) "
                        "and send the HTTP/2 preface (default %(default)s; > 0, finite)")
    p.add_argument("--idle-timeout-s", type=float, default=d.idle_timeout_s,
                   help="h2 transport: a connection with no stream open this long is closed (GOAWAY) (default %(default)s; > 0, finite)")
    p.add_argument("--drain-s", type=float, default=1.0,
                   help="on SIGTERM: seconds of NOT_SERVING health (streams still served) before the listener closes (default %(default)s)")
    p.add_argument("--emulate-wan", action="store_true",
                   help="testbeds: delay each probe by the one-way latency both ways (as the leaf Envoy delays requests)")
    add_tracing_flags(p, "decision")
    p.set_defaults(func=run_root)


def run_leaf(args: argparse.Namespace) -> int:
    from dlb.ext_proc.leaf_serve import LeafOptions, run_leaf
    from dlb.service.runner import run_event_loop

    if not 0 <= args.drain_s < math.inf:  # as dlb serve root: nan would skip the drain, inf never end it
        raise UsageError(f"--drain-s must be >= 0 and finite, got {args.drain_s}")
    cfg, cell = load_cell(args.config, args.cell)
    if cell.inference_pool is not None:  # no servers in the file: only the EPP follows the pool's pods
        raise UsageError(f"dlb serve leaf: {args.config}: cells[{cell.index}].inference_pool: the servers are an InferencePool's "
                         f"pods, which dlb serve epp follows; run that for cell {cell.name!r}")
    if cell.leaf.foreign:  # its probes are answered by what runs there (leaf.source); a DLB leaf would count nothing
        raise UsageError(f"dlb serve leaf: {args.config}: cells[{cell.index}].leaf.source is {cell.leaf.source!r}: cell "
                         f"{cell.name!r} runs no DLB leaf (the roots read its {cell.leaf.source} metrics); run this only "
                         f"for cells with source 'dlb'")
    if args.replica:
        n = len(cell.leaf.all_replicas())
        if not 0 <= args.replica < n:
            raise UsageError(f"dlb serve leaf: --replica {args.replica}: {args.config}: cells[{cell.index}].leaf.replicas "
                             f"gives cell {args.cell!r} {n} leaf replica(s), numbered 0..{n - 1}")
        cfg = cfg.leaf_replica(args.cell, args.replica)  # this replica's addresses, the cell's everything else
        cell = cfg.cell(args.cell)
    for flag, value in (("--envoy-check-address", args.envoy_check_address), ("--envoy-admin", args.envoy_admin)):
        from dlb.config.loader import parse_hostport

        if value is not None and parse_hostport(value) is None:
            raise UsageError(f"dlb serve leaf: {flag}: {value!r} is not host:port")
    # Probe and access log on one gRPC server. The ext_proc is served there too when it shares the
    # probe's address (or --ext-proc-transport grpc); on its own address it gets the HTTP/2 transport.
    listen = [args.listen or str(cell.leaf.probe)]
    ext_proc_h2 = None
    if args.listen is None and cell.leaf.ext_proc is not None and cell.leaf.ext_proc != cell.leaf.probe:
        if args.ext_proc_transport == "h2":
            ext_proc_h2 = str(cell.leaf.ext_proc)
        else:
            listen.append(str(cell.leaf.ext_proc))
    metrics = args.metrics
    if metrics is None:
        if cell.leaf.probe.port + 10000 > 65535:  # else a traceback from the metrics server's bind
            raise UsageError(f"dlb serve leaf: {args.config}: cells[{cell.index}].leaf.probe port {cell.leaf.probe.port} + 10000 "
                             f"(the default metrics port) is past 65535; give --metrics HOST:PORT (or '' for none)")
        metrics = f"{cell.leaf.probe.host}:{cell.leaf.probe.port + 10000}"
    # Routing knobs are not options: run_leaf reads them from the config's policy (later from xDS).
    run_event_loop(run_leaf(cfg, LeafOptions(
        cell=args.cell, listen=tuple(listen), metrics=metrics or None, ready_file=args.ready_file,
        scrape_period_s=args.scrape_period_ms / 1000.0, seed=args.seed,
        envoy_check_period_s=args.envoy_check_period_ms / 1000.0, xds=args.xds, xds_delta=args.xds_delta,
        ext_proc_h2=ext_proc_h2, drain_s=args.drain_s, envoy_address=args.envoy_check_address,
        envoy_admin=args.envoy_admin, tracing=tracing_options(args, f"dlb-leaf-{args.cell}"))))
    return 0


def register_leaf(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("leaf", help="leaf agent: picks servers in a cell, measures it, answers probes")
    p.add_argument("--config", required=True, help="DLB config YAML")
    p.add_argument("--xds", default=None, help="control plane host:port: follow its server set (EDS) and fleet prior")
    p.add_argument("--xds-delta", action="store_true", help="use incremental xDS with the control plane")
    p.add_argument("--cell", required=True, help="the cell this leaf serves")
    p.add_argument("--replica", type=int, default=0, help="which leaf replica of the cell: 0 (leaf's addresses) or k (leaf.replicas[k-1])")
    p.add_argument("--listen", default=None, help="gRPC host:port for probe + ext_proc + access log (default: cells[].leaf.probe)")
    p.add_argument("--metrics", default=None, help="Prometheus host:port ('' = off; default: probe host, probe port + 10000)")
    p.add_argument("--scrape-period-ms", type=float, default=200.0, help="server /metrics scrape period (0 = off)")
    p.add_argument("--envoy-check-period-ms", type=float, default=200.0,
                   help="TCP check of this agent's leaf Envoy (--envoy-check-address); probes fail while it is down (0 = off)")
    p.add_argument("--envoy-check-address", default=None,
                   help="this agent's own leaf Envoy host:port, checked and used for background probes (default: "
                        "cells[].leaf.address; in a pod 127.0.0.1:<port>, not the cell's load balancer)")
    p.add_argument("--envoy-admin", default=None,
                   help="that Envoy's admin host:port: count healthy only the servers it routes to (default: off)")
    p.add_argument("--ready-file", default=None, help="write {grpc, metrics, pid} JSON here once serving")
    p.add_argument("--seed", type=int, default=None, help="RNG seed (server-pick tie-breaks; default random)")
    p.add_argument("--ext-proc-transport", choices=("h2", "grpc"), default="h2",
                   help="server for cells[].leaf.ext_proc when it has its own address: DLB's HTTP/2 transport (default) or grpc.aio")
    p.add_argument("--drain-s", type=float, default=1.0,
                   help="on SIGTERM: seconds of gRPC health NOT_SERVING (Envoy stops sending) before streams are closed "
                        "(default %(default)s)")
    add_tracing_flags(p, "pick")
    from dlb.config.cli import add_moved_flags

    add_moved_flags(p, {
        "--pick": "policy.plugins: [{type: prequal}] or [{type: rif}]",
        "--choices": "parameters.choices of the prequal or rif plugin in policy.plugins",
        "--window-s": "parameters.window_s of the latency-fit plugin in policy.plugins",
        "--refit-period-s": "parameters.refit_period_s of the latency-fit plugin in policy.plugins",
        "--background-probe-min-interval-ms": "parameters.min_interval_ms of the background-probe plugin in policy.plugins",
        "--background-probe-max-interval-ms": "parameters.max_interval_ms of the background-probe plugin in policy.plugins",
        "--background-probe-budget": "parameters.budget of the background-probe plugin in policy.plugins",
        "--background-probe-max-tokens": "parameters.max_tokens of the background-probe plugin in policy.plugins",
        "--background-probe-model": "parameters.model of the background-probe plugin in policy.plugins",
    })
    p.set_defaults(func=run_leaf)
