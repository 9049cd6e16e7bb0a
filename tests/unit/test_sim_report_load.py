"""``dlb sim report`` reads results files plain or gzip'd: research/ keeps large runs as ``.json.gz``."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from dlb.sim.report import load

RECORDS = [{"experiment": "baseline", "policy": "Rand", "mean": 1.5}]


def test_gzipped_and_plain_results_load_the_same(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text(json.dumps(RECORDS))
    (tmp_path / "r.json.gz").write_bytes(gzip.compress(json.dumps(RECORDS).encode()))
    assert load(tmp_path / "r.json") == load(tmp_path / "r.json.gz") == RECORDS


def test_a_truncated_gzip_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "r.json.gz").write_bytes(gzip.compress(json.dumps(RECORDS).encode())[:-12])
    with pytest.raises(ValueError, match="cannot read results file"):
        load(tmp_path / "r.json.gz")
