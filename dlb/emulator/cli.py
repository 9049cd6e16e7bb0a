"""``dlb serve emulator``: run one emulated inference server until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from dlb.emulator.faults import FaultError, Faults
from dlb.emulator.profile import BUILTIN_PROFILES, ProfileError, load_profile
from dlb.load.argtypes import output_file, port_or_zero
from dlb.log import get_logger


def register(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "emulator",
        help="run an emulated OpenAI-compatible GPU inference server",
        description="An OpenAI-compatible server that behaves like a continuous-batching GPU server "
        "(vLLM-style metrics, latency from a step-time profile, fault knobs). See docs/emulator.md.",
    )
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=port_or_zero, default=8000, help="listen port; 0 picks a free one (default 8000)")
    p.add_argument("--port-file", type=output_file, default=None, help="after binding, write the port to this file (for --port 0)")
    p.add_argument("--admin-port", type=port_or_zero, default=None,
                   help="serve the admin API (/admin/faults, /admin/state) on this port, never on --port; 0 picks a "
                   "free one (default: no admin API, faults only from the flags below)")  # fmt: skip
    p.add_argument("--admin-port-file", type=output_file, default=None, help="after binding, write the admin port to this file")
    p.add_argument("--server-id", default=None, help="name returned in the x-dlb-server header (default emulator-PORT)")
    p.add_argument("--model", action="append", default=None,
                   help="model name served; repeat for aliases (default dlb-emulated)")  # fmt: skip
    p.add_argument("--profile", default="llama-8b-h100",
                   help=f"built-in ({', '.join(sorted(BUILTIN_PROFILES))}), a profile JSON file, "
                   "or STEP_TIMES.json#MODEL (default llama-8b-h100)")  # fmt: skip
    p.add_argument("--base-ms", type=float, default=None, help="override the profile's per-step floor (ms)")
    p.add_argument("--max-batch", type=int, default=16, help="running sequences per engine step (default 16)")
    p.add_argument("--max-queue", type=int, default=64, help="requests waiting beyond free slots (default 64)")
    p.add_argument("--seed", type=int, default=0, help="seed of output-length sampling and error injection")
    p.add_argument("--time-scale", type=float, default=1.0, help="wall seconds per profile second (0.1 = 10x faster)")
    p.add_argument("--overflow-status", type=int, choices=[429, 503], default=429, help="status when the queue is full")
    p.add_argument("--output-tokens", choices=["max_tokens", "sample"], default="max_tokens",
                   help="max_tokens: generate exactly max_tokens when given; sample: always sample (capped)")  # fmt: skip
    p.add_argument("--output-mean", type=float, default=128.0, help="mean of sampled output lengths (default 128)")
    p.add_argument("--max-model-len", type=int, default=32768, help="context length limit (default 32768)")
    p.add_argument("--dp-size", type=int, default=1,
                   help="data-parallel ranks stepping together; rank r listens on PORT+r, as vLLM's external DP "
                   "load balancing (docs/emulator.md, DP mode)")  # fmt: skip
    p.add_argument("--prefix-cache", action="store_true",
                   help="model automatic prefix caching: a repeated prompt prefix skips prefill (vLLM v1 default)")  # fmt: skip
    f = p.add_argument_group("faults (also settable at runtime: POST /admin/faults on --admin-port)")
    f.add_argument("--error-rate", type=float, default=0.0, help="fraction of requests answered with --error-status")
    f.add_argument("--error-status", type=int, default=500, help="status of injected errors (default 500)")
    f.add_argument("--slowdown", type=float, default=1.0, help="multiply step times (default 1.0)")
    f.add_argument("--extra-latency-ms", type=float, default=0.0, help="fixed delay added to every request")
    f.add_argument("--down", action="store_true", help="start 'down': 503 on everything but /admin")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dlb.emulator.server import EmulatorConfig, EmulatorServer, new_event_loop

    log = get_logger("dlb.emulator")
    try:
        profile = load_profile(args.profile, base_ms=args.base_ms)
        faults = Faults(error_rate=args.error_rate, error_status=args.error_status, slowdown=args.slowdown,
                        extra_latency_ms=args.extra_latency_ms, down=args.down)  # fmt: skip
        config = EmulatorConfig(
            host=args.host,
            port=args.port,
            admin_port=args.admin_port,
            server_id=args.server_id or "",
            models=tuple(args.model or ["dlb-emulated"]),
            profile=profile,
            max_batch=args.max_batch,
            max_queue=args.max_queue,
            seed=args.seed,
            time_scale=args.time_scale,
            overflow_status=args.overflow_status,
            output_mode=args.output_tokens,
            output_mean=args.output_mean,
            max_model_len=args.max_model_len,
            prefix_cache=args.prefix_cache,
            faults=faults,
        )
        if args.dp_size < 1:
            raise ValueError(f"--dp-size: must be >= 1, got {args.dp_size}")
        if args.dp_size > 1:
            from dlb.emulator.dp import DpEmulator

            server: Any = DpEmulator(config, args.dp_size)
        else:
            server = EmulatorServer(config)
    except (ProfileError, FaultError, ValueError) as e:
        log.error("emulator_bad_config", error=str(e))
        return 2

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if not server.config.server_id:
            # The default id needs the bound port, known only after start; set it before any request.
            server.config.server_id = f"emulator-{args.port}" if args.port else "emulator"
        await server.start()
        if server.config.server_id == "emulator" and not args.port:
            server.config.server_id = f"emulator-{server.port}"
        # The admin port first: a reader that sees the API port file may use both at once.
        for path, port in ((args.admin_port_file, server.admin_port), (args.port_file, server.port)):
            if path and port is not None:
                tmp = Path(f"{path}.tmp{os.getpid()}")
                tmp.write_text(f"{port}\n")  # noqa: ASYNC240 - once, at start-up
                tmp.replace(path)  # noqa: ASYNC240 - atomic: a reader never sees a half-written port
        try:
            await stop.wait()
        finally:
            await server.stop()

    loop = new_event_loop()
    try:
        loop.run_until_complete(main())
    except OSError as e:
        log.error("emulator_listen_failed", host=args.host, port=args.port, admin_port=args.admin_port, error=str(e))
        return 1
    finally:
        loop.close()
    return 0
