"""One log-event style: the event of every log call in dlb/ is a snake_case key (log queries match on it)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "dlb"
LEVELS = {"debug", "info", "warning", "warn", "error", "exception", "critical"}
KEY = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")


def events() -> list[tuple[str, str]]:
    """(file:line, event) for every ``<logger>.<level>("literal", ...)`` call in dlb/."""
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        if "_pb2" in path.name:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in LEVELS
                    and isinstance(node.func.value, (ast.Name, ast.Attribute))
                    and "log" in ast.unparse(node.func.value).lower() and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                out.append((f"{path.relative_to(ROOT.parent)}:{node.lineno}", node.args[0].value))
    return out


def test_log_events_are_snake_case_keys() -> None:
    """Every log event in dlb/ is a snake_case key, not prose (details go in key=value fields)."""
    found = events()
    assert len(found) > 30  # the scan sees the codebase's log calls
    prose = [f"{where}: {event!r}" for where, event in found if not KEY.match(event)]
    assert not prose, "log events must be snake_case keys:\n" + "\n".join(prose)
