"""What a ``dlb sim --out`` directory holds, read and written so that nothing there is lost or mixed.

``results.json`` (every record), ``benchmark.json`` (per experiment: wall/CPU time, runs, settings,
the code) and ``partial-<experiment>.jsonl`` (records streamed as runs finish). The full protocol is
~7 h of 2-core time, run in pieces with ``--resume``; these files are its only memory, so:

* a directory keeps one build: records and benchmark entries of other code (``code``, the git tree of
  ``dlb/``, :func:`dlb.provenance.code_tree`) are dropped when an experiment is merged in;
* a partial file is removed only after its records are in ``results.json``;
* damaged files (a line cut by a kill, a hand edit, a file where a directory should be) give a clear
  message or a warning on stderr, never a traceback after hours of work.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from dlb.resumable import json_lines
from dlb.sim.experiments import Job, nan_for_null, record_key

RESULTS = "results.json"
BENCHMARK = "benchmark.json"


class OutDirError(Exception):
    """An ``--out`` directory (or a file in it) that cannot be used; the message names the path."""


def _warn(msg: str) -> None:
    print(f"dlb sim: warning: {msg}", file=sys.stderr)


def prepare(out: Path) -> None:
    """Create ``out`` and check, before any work, that the files a run writes can be written."""
    if out.exists() and not out.is_dir():
        raise OutDirError(f"--out {out}: exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutDirError(f"--out {out}: cannot create it: {e.strerror or e}") from e
    for name in (RESULTS, BENCHMARK, "results.md"):
        p = out / name
        if p.exists() and not p.is_file():
            raise OutDirError(f"{p}: exists and is not a file; move it away")


def _read_json(path: Path) -> Any:
    """The JSON in ``path``; None when it is missing. Unreadable or invalid: OutDirError."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise OutDirError(f"{path}: cannot read it: {e}") from e
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise OutDirError(f"{path}: not valid JSON ({e})") from e


def results_of(out: Path, code: str, drop_experiment: str | None = None) -> list[dict]:
    """Records in ``results.json`` of ``code`` (except ``drop_experiment``'s). A file that is not a list
    of records is reported and treated as empty (it is rewritten with this build's records)."""
    path = out / RESULTS
    try:
        data = _read_json(path)
    except OutDirError as e:
        _warn(f"{e}; its records are not kept")
        return []
    if data is None:
        return []
    if not isinstance(data, list):
        _warn(f"{path}: not a list of records; its contents are not kept")
        return []
    if bad := sum(not isinstance(r, dict) for r in data):
        _warn(f"{path}: {bad} of its {len(data)} entries are not records (JSON objects); they are not kept")
    return nan_for_null([r for r in data if isinstance(r, dict) and r.get("code") == code and r.get("experiment") != drop_experiment])


def has_results(out: Path, experiment: str, code: str) -> bool:
    return any(r.get("experiment") == experiment for r in results_of(out, code))


def benchmark_entries(out: Path, code: str, warn: bool) -> dict[str, dict]:
    """``benchmark.json``'s per-experiment entries of ``code``; unreadable: nothing (with a warning when
    ``warn``: a resume that cannot see what finished runs it again)."""
    try:
        data = _read_json(out / BENCHMARK)
    except OutDirError as e:
        if warn:
            _warn(f"{e}; no experiment counts as finished, every one runs again")
        return {}
    per = data.get("per_experiment") if isinstance(data, dict) else None
    if data is not None and not isinstance(per, dict):
        if warn:
            _warn(f"{out / BENCHMARK}: no per_experiment table; no experiment counts as finished")
        return {}
    return {k: v for k, v in (per or {}).items() if isinstance(v, dict) and v.get("code") == code}


def partial_path(out: Path, experiment: str) -> Path:
    return out / f"partial-{experiment}.jsonl"


def read_partial(out: Path, experiment: str, jobs: list[Job], code: str) -> list[dict]:
    """Records an interrupted run streamed for ``jobs`` (same code and settings); a line cut by the kill,
    or any line that is not such a record, is skipped."""
    path = partial_path(out, experiment)
    wanted = {j.key() for j in jobs}
    kept: dict[tuple, dict] = {}
    skipped = 0
    try:
        for line, rec in json_lines(path):
            try:
                key = record_key(rec) if isinstance(rec, dict) and rec.get("code") == code else None
            except (KeyError, TypeError):
                key = None
            if key is not None and key in wanted:
                kept[key] = rec
            elif line.strip():
                skipped += 1
    except OSError as e:
        raise OutDirError(f"{path}: cannot read it: {e}") from e
    if skipped:
        print(f"{path}: {skipped} line(s) not kept (other code or settings, or cut by the interruption)", file=sys.stderr)
    return list(kept.values())


def pieces_wall(records: list[dict]) -> tuple[float, int]:
    """Wall seconds summed over the pieces an experiment ran in, and how many pieces."""
    pieces: dict[float, float] = {}
    for r in records:
        start = r.get("piece_started_at")
        if isinstance(start, (int, float)):
            end = r.get("finished_at", start)
            pieces[start] = max(pieces.get(start, start), end if isinstance(end, (int, float)) else start)
    return sum(end - start for start, end in pieces.items()), len(pieces)


def dedupe(records: list[dict]) -> tuple[list[dict], int]:
    """One record per job (:func:`record_key`): the same results file given twice to the report would
    otherwise count every run twice. Returns the records and how many duplicates were dropped."""
    seen: set[tuple] = set()
    out = []
    for r in records:
        try:
            key = record_key(r)
        except KeyError:  # not a paper-experiment record (priors): its own fields identify it
            key = tuple(sorted((k, repr(v)) for k, v in r.items() if k not in _TIMING))
        if key in seen:
            continue
        seen.add(key)
        out.append(r)
    return out, len(records) - len(out)


#: Fields that differ between two runs of the same job (they time the run, not its result).
_TIMING = frozenset({"wall_s", "cpu_s", "piece_started_at", "finished_at", "norm_mean", "norm_p90", "norm_mean_served"})
