"""The tuning probes' runner: each job on a 2-process spawn pool, one JSON line written per run as it finishes
(so a stopped probe keeps what it ran)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from multiprocessing import get_context
from typing import Any


def write_as_done(one: Callable[[Any], dict], jobs: Iterable[Any], path: str) -> None:
    with get_context("spawn").Pool(2) as pool, open(path, "w") as out:
        for rec in pool.imap_unordered(one, list(jobs)):
            out.write(json.dumps(rec) + "\n")
            out.flush()
