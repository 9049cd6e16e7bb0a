"""Libraries' stdlib log records come out as DLB's JSON lines, rate-limited (a peer's malformed requests to the
control plane's status port wrote a 9-line traceback each into its JSON log)."""

from __future__ import annotations

import io
import json
import logging

import structlog

from dlb.log import stdlib_handler


def test_a_library_traceback_is_one_json_line_and_a_flood_is_cut() -> None:
    out = io.StringIO()
    logger = logging.getLogger("dlb.test.stdlib-handler")
    logger.propagate = False  # only this handler, whatever the process configured
    logger.setLevel(logging.INFO)
    logger.addHandler(handler := stdlib_handler(out, structlog.processors.JSONRenderer()))
    for _ in range(50):
        try:
            raise ValueError("LineTooLong: b'aaaa'")
        except ValueError:
            logger.exception("Error handling request")
    logger.removeHandler(handler)
    lines = out.getvalue().splitlines()
    assert 1 <= len(lines) <= 6, len(lines)  # the limiter's burst, not 50 records of 9 lines
    first = json.loads(lines[0])
    assert first["event"] == "Error handling request" and first["logger"] == "dlb.test.stdlib-handler" and first["level"] == "error"
    assert "LineTooLong" in first["exception"]
