"""structlog configured once for the whole package.

Every service and command calls :func:`configure` at start-up; library modules only call
:func:`get_logger`. JSON lines by default (machine-readable for operators), a console renderer
when asked for (``DLB_LOG_FORMAT=console``), so logs stay greppable in CI output.

Warnings and errors are rate-limited per event kind (:class:`EventLimiter`): a hostile peer makes the
same few events over and over (one ``h2_connection_error`` per bad connection: 1,435 lines from 1,531
fuzzed conversations), and a log that grows with what peers send is itself a resource they exhaust.
The line that passes after a quiet spell says how many of its kind were ``dropped``.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import structlog

_configured = False


class _Stderr:
    """``sys.stderr`` as it is at each write, not as it was at :func:`configure`.

    structlog's PrintLogger keeps the file it was given. A process that swaps ``sys.stderr`` after
    configuring (pytest's capture does, per test) would otherwise log into a closed file — a
    ``ValueError: I/O operation on closed file`` raised from the *next* test's log call.
    """

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


#: Levels the limiter applies to: routine info lines (start, stop, reconfiguration) are not a peer's doing.
_LIMITED_LEVELS = frozenset({"warning", "error", "critical", "exception"})


@dataclass
class EventLimiter:
    """A token bucket per event kind: ``burst`` lines at once, then one per ``every_s``; a structlog
    processor (it raises ``DropEvent`` for the rest, and adds ``dropped`` to the next line that passes)."""

    burst: int = 5
    every_s: float = 10.0
    clock: Callable[[], float] = time.monotonic
    #: kind -> [tokens, last refill time, dropped since the last line]
    _buckets: dict[str, list[float]] = field(default_factory=dict)

    def __call__(self, _logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        if event.get("level", method) not in _LIMITED_LEVELS:
            return event
        kind = str(event.get("event"))
        now = self.clock()
        bucket = self._buckets.get(kind)
        if bucket is None:
            if len(self._buckets) >= 1000:  # event names are ours, but bound the table anyway
                self._buckets.clear()
            bucket = self._buckets[kind] = [float(self.burst), now, 0.0]
        tokens = min(float(self.burst), bucket[0] + (now - bucket[1]) / self.every_s)
        bucket[1] = now
        if tokens < 1.0:
            bucket[0] = tokens
            bucket[2] += 1
            raise structlog.DropEvent
        bucket[0] = tokens - 1.0
        if bucket[2]:
            event["dropped"] = int(bucket[2])
            bucket[2] = 0.0
        return event


def configure(level: str | None = None, fmt: str | None = None) -> None:
    """Configure structlog and stdlib logging; idempotent."""
    global _configured
    if _configured:
        return
    level_name = (level or os.environ.get("DLB_LOG_LEVEL", "INFO")).upper()
    numeric = getattr(logging, level_name, logging.INFO)
    fmt = fmt or os.environ.get("DLB_LOG_FORMAT", "json")
    renderer: structlog.types.Processor
    if fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    else:
        renderer = structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            EventLimiter(),
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=_Stderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=numeric, handlers=[stdlib_handler(_Stderr(), renderer)])
    _configured = True


def stdlib_handler(stream: Any, renderer: structlog.types.Processor) -> logging.Handler:
    """Libraries' stdlib records (aiohttp, grpc, asyncio) as the same lines as ours, rate-limited alike: a
    peer's malformed requests to the status port wrote a 9-line traceback each into an otherwise JSON log."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        foreign_pre_chain=[structlog.stdlib.add_logger_name, structlog.processors.add_log_level,
                           structlog.processors.TimeStamper(fmt="iso", utc=True), structlog.processors.format_exc_info]))
    handler.addFilter(_StdlibLimiter())
    return handler


class _StdlibLimiter(logging.Filter):
    """:class:`EventLimiter` for stdlib records, per logger and message template."""

    def __init__(self) -> None:
        super().__init__()
        self.limiter = EventLimiter()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            self.limiter(None, "", {"event": f"{record.name}: {record.msg}"[:200], "level": record.levelname.lower()})
        except structlog.DropEvent:
            return False
        return True


def get_logger(name: str | None = None, **bound: object) -> structlog.stdlib.BoundLogger:
    """A logger bound to ``name``; configures defaults lazily if no service did."""
    if not _configured:
        configure()
    return structlog.get_logger(name, **bound) if name else structlog.get_logger(**bound)
