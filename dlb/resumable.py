"""What a long run needs to be stopped and resumed: workers that leave Ctrl-C to their parent, and a
reader for the JSON lines it streamed that survives the line a kill cut in half.

``dlb sim`` and ``dlb theory`` both stream one record per finished job and resume from those files;
they had one copy each of these two pieces.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def ignore_sigint() -> None:
    """Pool initializer: workers ignore Ctrl-C and leave it to the parent, which stops the pool and says
    how to resume (a worker's own ``KeyboardInterrupt`` would print one traceback per worker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def json_lines(path: str | Path) -> Iterator[tuple[str, Any]]:
    """``(line, value)`` for each line of ``path``; ``value`` is ``None`` for a line that is not JSON (the
    one a kill cut short, or a stray byte). A missing file yields nothing; any other ``OSError`` is
    raised for the caller to name. Undecodable bytes are replaced, so one bad byte costs one line."""
    try:
        text = Path(path).read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            value = None
        yield line, value
