"""Serve until SIGTERM/SIGINT, then drain: the shutdown every DLB service shares.

Why one function: Envoy must see a service turn NOT_SERVING before its listener closes, or it keeps
opening streams to a process about to exit; every service drains in the same order for that reason.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from dlb.service.health import HealthState


class Stoppable(Protocol):
    """A server that stops listening and gives in-flight calls ``grace`` seconds (grpc.aio's or DLB's)."""

    async def stop(self, grace: float, /) -> None: ...


async def serve_until_signal(server: Stoppable, on_stop: Callable[[], Awaitable[None]] | None = None,
                             grace_s: float = 2.0, health: HealthState | None = None, drain_s: float = 0.0,
                             audience: Callable[[], bool] | None = None) -> None:
    """Run until SIGTERM/SIGINT, then drain and stop.

    Draining, in order: the gRPC health status turns NOT_SERVING (``health``) and stays so for
    ``drain_s`` — long enough for Envoy's health check to see it and stop opening streams here, while
    the streams already open keep being served; then ``on_stop``; then the server stops listening and
    in-flight streams get ``grace_s`` to finish (a stream the EPP carries lasts its whole generation:
    cut at 2 s, every answer in flight was lost on a graceful stop). A second signal skips the rest of
    the drain or of the grace, and so does ``audience()`` turning False (the Envoy the drain is for is gone: a leaf agent stopped with
    its Envoy, as ``dlb up`` and a pod stop them, has nobody left to drain for — waiting out the drain
    made every leaf miss the supervisor's stop budget).
    """
    import asyncio
    import signal

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    if health is not None:
        health.serving = False
    if drain_s > 0:
        from dlb.log import get_logger

        get_logger("dlb.lifecycle").info("draining", drain_s=drain_s)
        stop.clear()
        end = loop.time() + drain_s
        while not stop.is_set() and (audience is None or audience()):  # a second signal ends the drain early
            left = end - loop.time()
            if left <= 0:
                break
            try:
                async with asyncio.timeout(min(left, 0.05 if audience is not None else left)):
                    await stop.wait()
            except TimeoutError:
                pass
    if on_stop is not None:
        await on_stop()
    stopping = asyncio.ensure_future(server.stop(grace_s))
    stop.clear()
    second = asyncio.ensure_future(stop.wait())
    await asyncio.wait((stopping, second), return_when=asyncio.FIRST_COMPLETED)
    if not stopping.done():  # a second signal: end the grace now
        await server.stop(0)
    second.cancel()
    await stopping
