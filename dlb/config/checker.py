"""The generic field checker: each check records a problem and returns a fallback, so checking goes on.

Why a hand-written checker rather than a schema library: one message per problem with the file, the
line, the field path and a reason a person can act on; unknown keys reported with a spelling hint;
and checking never stops at the first problem (a bad field yields its default).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from enum import Enum
from typing import Any, TypeVar

from dlb.config.hostport import parse_hostport
from dlb.config.model import HostPort
from dlb.config.problems import Problem
from dlb.config.yaml_nodes import join

E = TypeVar("E", bound=Enum)
MAX_UNKNOWN_KEYS = 20
#: The longest duration Envoy's protobuf Duration holds (10,000 years): a larger timeout is refused by
#: Envoy when the control plane pushes it, so it is refused here, where the field can be named.
MAX_DURATION_S = 315_576_000_000.0
#: The shortest non-zero timeout: Envoy durations are rendered at microsecond resolution, and anything
#: under a millisecond would either round to 0 (no limit at all) or fail every request.
MIN_TIMEOUT_S = 0.001
#: The value of a key that is not there (distinct from an explicit null).
MISSING: Any = object()


#: The folder a config's relative paths (``root_token_file``, ``tls.*``) are taken from, when the file being
#: read is a copy elsewhere: ``dlb up`` starts its processes from a snapshot of the last config it accepted.
CONFIG_DIR_ENV = "DLB_CONFIG_DIR"


def config_dir(source: str) -> str:
    """The folder relative paths in the config ``source`` are from: :data:`CONFIG_DIR_ENV` if set, else
    the file's own folder (the working directory for a config that is not a file)."""
    if os.environ.get(CONFIG_DIR_ENV):
        return os.environ[CONFIG_DIR_ENV]
    return os.path.dirname(os.path.abspath(source)) if os.path.exists(source) else os.getcwd()


class Checker:
    """Checks fields of one file, appending a :class:`Problem` (with the nearest line) for each mistake."""

    def __init__(self, source: str, marks: dict[str, int], problems: list[Problem]):
        self.source = source
        self.marks = marks
        self.problems = problems

    def err(self, path: str, reason: str) -> None:
        p = path
        while p and p not in self.marks:  # nearest ancestor that has a line
            p = parent(p)
        self.problems.append(Problem(self.source, path, reason, self.marks.get(p)))

    # -- structure ---------------------------------------------------------------------------
    def mapping(self, value: Any, path: str, keys: Iterable[str], required: Iterable[str] = (), unknown: str = "unknown key") -> dict[str, Any]:
        """``value`` as a dict with only ``keys``; unknown and missing required keys are problems.

        Required keys are reported here, once; the scalar checkers below return their default for a
        missing key without a second message.
        """
        if value is MISSING or value is None:
            value = {}
        if not isinstance(value, dict):
            self.err(path, f"must be a mapping, got {kind(value)}")
            return {}
        value = {str(k): v for k, v in value.items()}  # config_from_dict may get non-string keys
        known = set(keys)
        strangers = [k for k in value if k not in known]
        if len(strangers) > MAX_UNKNOWN_KEYS:  # name a few, not 100,000 (each with a spelling hint)
            self.err(path, f"{len(strangers):,} keys are not allowed here ({', '.join(strangers[:3])}, ...); allowed: {', '.join(sorted(known)) or 'none'}")
            strangers = []
        for k in strangers:
            if k not in known:
                hint = close(k, known)
                self.err(join(path, k), unknown + (f" (did you mean {hint!r}?)" if hint else f"; allowed: {', '.join(sorted(known)) or 'none'}"))
        for k in required:
            if k not in value:
                self.err(join(path, k), "required")
        return {k: v for k, v in value.items() if k in known}

    def sequence(self, value: Any, path: str, *, required: bool = False, nonempty: bool = False, max_len: int | None = None) -> list[Any]:
        if value is MISSING or value is None:
            if required:
                self.err(path, "required" if value is MISSING else "is null (an empty value): must be a list")
            return []
        if not isinstance(value, list):
            self.err(path, f"must be a list, got {kind(value)}")
            return []
        if nonempty and not value:
            self.err(path, "must not be empty")
        if max_len is not None and len(value) > max_len:  # checks across items are quadratic: check the first max_len
            self.err(path, f"{len(value):,} items: at most {max_len} are allowed")
            return value[:max_len]
        return value

    # -- scalars -----------------------------------------------------------------------------
    def number(
        self,
        m: dict[str, Any],
        key: str,
        path: str,
        default: float | None,
        *,
        gt: float | None = None,
        ge: float | None = None,
        lt: float | None = None,
        le: float | None = None,
        integer: bool = False,
    ) -> Any:
        p = join(path, key)
        v = m.get(key, MISSING)
        if v is MISSING or v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
            self.err(p, f"must be {'an integer' if integer else 'a number'}, got {show(v)}")
            return default
        if not math.isfinite(v):
            self.err(p, f"must be finite, got {v} (a number past ±1.8e308 reads as infinite)" if not math.isnan(v) else "must be finite, got .nan")
            return default
        for bound, ok, word in ((gt, lambda b: v > b, ">"), (ge, lambda b: v >= b, ">="), (lt, lambda b: v < b, "<"), (le, lambda b: v <= b, "<=")):
            if bound is not None and not ok(bound):
                self.err(p, f"must be {word} {fmt(bound)}, got {fmt(v)}")
                return default
        return int(v) if integer else float(v)

    def timeout(self, m: dict[str, Any], key: str, path: str, default: float, *, zero: str | None = "no limit") -> Any:
        """A duration in seconds: ``0`` when ``zero`` says what 0 means (else it must be > 0), otherwise
        between :data:`MIN_TIMEOUT_S` and :data:`MAX_DURATION_S`."""
        v = self.number(m, key, path, MISSING, ge=0 if zero else None, gt=None if zero else 0, le=MAX_DURATION_S)
        if v is MISSING:
            return default
        if 0 < v < MIN_TIMEOUT_S:
            self.err(join(path, key), f"must be {f'0 ({zero}) or ' if zero else ''}at least {fmt(MIN_TIMEOUT_S)} s, got {fmt(v)}")
            return default
        return v

    def boolean(self, m: dict[str, Any], key: str, path: str, default: bool) -> bool:
        v = m.get(key, MISSING)
        if v is MISSING:
            return default
        if not isinstance(v, bool):
            self.err(join(path, key), f"must be true or false, got {show(v)}")
            return default
        return v

    def string(self, m: dict[str, Any], key: str, path: str, default: str | None, *, pattern: re.Pattern[str] | None = None, what: str = "") -> Any:
        p = join(path, key)
        v = m.get(key, MISSING)
        if v is MISSING:
            return default
        if not isinstance(v, str):
            self.err(p, f"must be a string, got {show(v)}")
            return default
        if pattern is not None and not pattern.match(v):
            self.err(p, f"{v!r} is not {what or 'valid'}")
            return default
        return v

    def choice(self, m: dict[str, Any], key: str, path: str, enum: type[E], default: E) -> E:
        v = m.get(key, MISSING)
        if v is MISSING:
            return default
        try:
            return enum(v)
        except ValueError:
            self.err(join(path, key), f"{show(v)} is not one of: {', '.join(e.value for e in enum)}")
            return default

    def hostport(self, m: dict[str, Any], key: str, path: str, default: HostPort | None) -> HostPort | None:
        p = join(path, key)
        v = m.get(key, MISSING)
        if v is MISSING or v is None:
            return default
        hp = parse_hostport(v)
        if hp is None:
            host, sep, port = v.rpartition(":") if isinstance(v, str) else ("", "", "")
            if sep and port.isdigit() and parse_hostport(f"{host}:1") is not None:  # only the port is wrong
                self.err(p, f"{show(v)}: port {int(port)} is not in 1..65535")
            else:
                self.err(p, f"{show(v)} is not host:port (e.g. 127.0.0.1:8080, [::1]:8080, leaf.example:10000; quote it in YAML)")
            return default
        return hp


def parent(path: str) -> str:
    if path.endswith("]") and "[" in path:  # a key may itself be "]" (the fuzzer's find): not an index then
        return path[: path.rindex("[")]
    return path.rsplit(".", 1)[0] if "." in path else ""


def kind(v: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(type(v), type(v).__name__)


def show(v: Any) -> str:
    """A value as the file spells it (YAML's ``true``/``null``, not Python's ``True``/``None``)."""
    if isinstance(v, bool) or v is None:
        return {True: "true", False: "false", None: "null"}[v]
    return repr(v) if isinstance(v, (str, int, float)) else kind(v)


def fmt(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def close(word: str, options: Iterable[str]) -> str | None:
    import difflib

    hits = difflib.get_close_matches(word, list(options), n=1, cutoff=0.7)
    return hits[0] if hits else None
