"""``dlb serve control-plane`` and ``dlb config xds-bootstrap``."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import yaml

from dlb.config import ConfigError, load_config
from dlb.config.model import HostPort
from dlb.log import get_logger

log = get_logger("dlb.control_plane")


def register_serve(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("control-plane", help="serve xDS to root/leaf Envoys and DLB services; run the flow loop")
    p.add_argument("--config", required=True, help="DLB config YAML (reloaded on SIGHUP)")
    p.add_argument("--xds", default=None, help="xDS listen address host:port (default services.control_plane.xds)")
    p.add_argument("--status", default=None, help="status/metrics HTTP address host:port (default services.control_plane.status)")
    p.add_argument("--emulate-wan", action="store_true", help="leaf Envoys delay requests by the source cell's RTT (testbeds)")
    p.add_argument("--no-probe", action="store_true", help="do not probe leaves (serve the config only; no flow updates)")
    p.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 1
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio still works
        pass
    return asyncio.run(_serve(config, args))


async def _serve(config, args: argparse.Namespace) -> int:
    from dlb.xds.control_plane import ControlPlane

    cp = ControlPlane(config, emulate_wan=args.emulate_wan, probe=not args.no_probe)
    await cp.start(args.xds, args.status)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def reload() -> None:
        try:
            cp.reload(load_config(args.config))
        except ConfigError as e:
            log.error("config reload refused; keeping the running config", problems=[str(p) for p in e.problems])

    loop.add_signal_handler(signal.SIGHUP, reload)
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("control plane stopping")
    await cp.stop()
    return 0


def register_bootstrap(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("xds-bootstrap", help="write an Envoy bootstrap that takes everything from the control plane")
    p.add_argument("--role", choices=["root", "leaf"], required=True)
    p.add_argument("--cell", required=True)
    p.add_argument("--xds", required=True, help="control plane xDS address host:port")
    p.add_argument("--admin-port", type=int, required=True)
    p.add_argument("--node-id", default=None)
    p.add_argument("--delta", action="store_true", help="use incremental xDS (DELTA_GRPC)")
    p.add_argument("-o", "--output", default="-", help="file to write (default stdout)")
    p.set_defaults(func=run_bootstrap)


def run_bootstrap(args: argparse.Namespace) -> int:
    from dlb.xds.bootstrap import ads_bootstrap

    host, _, port = args.xds.rpartition(":")
    if not host or not port.isdigit():
        print(f"--xds: {args.xds!r} is not host:port", file=sys.stderr)
        return 2
    text = yaml.safe_dump(ads_bootstrap(args.role, args.cell, HostPort(host.strip("[]"), int(port)), args.admin_port,
                                        args.node_id, args.delta), sort_keys=False)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    return 0
