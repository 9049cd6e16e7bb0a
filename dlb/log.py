"""structlog configured once for the whole package.

Every service and command calls :func:`configure` at start-up; library modules only call
:func:`get_logger`. JSON lines by default (machine-readable for operators), a console renderer
when asked for (``DLB_LOG_FORMAT=console``), so logs stay greppable in CI output.
"""

from __future__ import annotations

import logging
import os
import sys

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
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=_Stderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=numeric, stream=_Stderr(), format="%(levelname)s %(name)s %(message)s")
    _configured = True


def get_logger(name: str | None = None, **bound: object) -> structlog.stdlib.BoundLogger:
    """A logger bound to ``name``; configures defaults lazily if no service did."""
    if not _configured:
        configure()
    return structlog.get_logger(name, **bound) if name else structlog.get_logger(**bound)
