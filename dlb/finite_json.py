"""JSON files with null where a figure is NaN or infinite, and the reader's way back.

Why: Python's ``json`` writes bare ``NaN``/``Infinity``, which is not JSON: jq, JavaScript and strict
parsers refuse the whole file (``dlb sim``'s results wrote ``"norm_mean": NaN`` whenever Rand did not run).
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite(obj: Any) -> Any:
    """``obj`` with every non-finite float (numpy's included) replaced by None, through dicts, lists and tuples."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def dumps(obj: Any, **kw: Any) -> str:
    """``json.dumps`` of :func:`finite` ``(obj)``; a non-finite number left anywhere raises, never a bare NaN."""
    return json.dumps(finite(obj), allow_nan=False, **kw)


def number(value: Any) -> float:
    """A figure read back: null (written for NaN) is NaN again, so readers of older files and new ones agree."""
    return math.nan if value is None else float(value)
