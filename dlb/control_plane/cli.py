"""``dlb serve control-plane``: the xDS server, the flow loop and the status endpoint, reloaded on SIGHUP."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from dlb.config import ConfigError, load_config
from dlb.log import get_logger

log = get_logger("dlb.control_plane")


def register_serve(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("control-plane", help="serve xDS to root/leaf Envoys and DLB services; run the flow loop")
    p.add_argument("--config", required=True, help="DLB config YAML (reloaded on SIGHUP)")
    p.add_argument("--xds", default=None, help="xDS listen address host:port (default services.control_plane.xds)")
    p.add_argument("--status", default=None, help="status/metrics HTTP address host:port (default services.control_plane.status)")
    p.add_argument("--emulate-wan", action="store_true", help="leaf Envoys delay requests by the source cell's RTT (testbeds)")
    p.add_argument("--no-probe", action="store_true", help="do not probe leaves (serve the config only; no flow updates)")
    p.add_argument("--mnlb", action="store_true",
                   help="baseline for comparisons: every flow endpoint's weights from the central MNLB LP (demand and "
                        "capacity measured from the leaves' probes) instead of the flow routers")
    p.add_argument("--ready-file", default=None, help="write {xds, status, pid} JSON here once serving")
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
    from dlb.control_plane.service import ControlPlane

    cp = ControlPlane(config, emulate_wan=args.emulate_wan, probe=not args.no_probe, mnlb=args.mnlb)
    xds_port, status_port = await cp.start(args.xds, args.status)
    if args.ready_file:
        import os

        from dlb.ext_proc.runner import write_ready

        write_ready(args.ready_file, {"xds": xds_port, "status": status_port, "pid": os.getpid()})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def reload() -> None:
        try:
            cp.reload(load_config(args.config))
        except ConfigError as e:
            log.error("config_reload_refused", problems=[str(p) for p in e.problems])  # the running config stays

    loop.add_signal_handler(signal.SIGHUP, reload)
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("control_plane_stopping")
    await cp.stop()
    return 0
