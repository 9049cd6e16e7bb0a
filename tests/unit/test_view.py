"""``dlb demo --no-live``'s plain progress line (the format CI logs and non-terminals get)."""

from __future__ import annotations

from typing import Any

import pytest

from dlb.testbed import view
from dlb.testbed.demo_run import Sample


def test_plain_line_shows_a_cell_without_finished_requests_as_a_dash_not_dash_s(monkeypatch: pytest.MonkeyPatch,
                                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{"cell": "us-east1", "rif": "3", "p50": "1.25", "from us-east1": "80%"},
            {"cell": "europe-west1", "rif": "0", "p50": "-", "from us-east1": "20%"}]

    def fake_rows(run: Any, sample: Any, runner: Any) -> list[dict[str, str]]:
        return rows

    monkeypatch.setattr(view, "cell_rows", fake_rows)
    monkeypatch.setattr(view, "headline", lambda run, sample, runner: "t=  5.0/60s")
    v = view.PlainView(run=None)  # type: ignore[arg-type]  # the run only feeds the patched helpers
    v.update(Sample(t=5.0, fleet={}, decisions={}, done=0, ok=0), runner=None)  # type: ignore[arg-type]
    line = capsys.readouterr().out.strip()
    assert line == "t=  5.0/60s | us-east1: rif 3 share 80% p50 1.25s | europe-west1: rif 0 share 20% p50 -", line


def test_the_headline_says_draining_after_the_load_ends_instead_of_a_time_past_the_duration() -> None:
    from types import SimpleNamespace

    run = SimpleNamespace(spec=SimpleNamespace(duration_s=30.0, rate_rps=15.3), degrade_window=None)
    sample = Sample(t=0.0, fleet={}, decisions={}, done=10, ok=10)
    for now, want in ((12.0, "t= 12.0/30s  offered"), (46.0, "t= 46.0s, load ended at 30s, draining  offered")):
        runner = SimpleNamespace(clock=lambda now=now: now, t0=0.0, sent=400, in_flight=3)
        assert view.headline(run, sample, runner).startswith(want), view.headline(run, sample, runner)  # type: ignore[arg-type]


def test_a_narrow_terminal_drops_the_least_needed_columns_instead_of_squeezing_every_cell_name() -> None:
    """In 80 columns rich squeezed every column to "us…": the cells could not be told apart."""
    from rich.console import Console
    from rich.table import Table

    rows = [{"cell": name, "servers": "3", "rif": "34", "p50": "2.41s", "p90": "4.80s", "ttft": "0.13s",
             "model": "a=2.10 b=0.060", "aversion": "0.00", "errors": "0.0%", "trend": "▁▂▃▄▅▆▇█" * 3,
             "from us-east1": "41%", "from europe-west4": "0%"}
            for name in ("us-east1", "us-central1", "europe-west4", "europe-west1")]
    wide = view.fit_columns(rows, 250)
    assert wide == list(rows[0])  # room for everything: nothing dropped
    cols = view.fit_columns(rows, 80)
    assert "cell" in cols and "from us-east1" in cols and "trend" not in cols and "model" not in cols
    console = Console(width=80, record=True, color_system=None)
    table = Table()
    for c in cols:
        table.add_column(c)
    for r in rows:
        table.add_row(*[r[c] for c in cols])
    console.print(table)
    text = console.export_text()
    assert all(name in text for name in ("us-east1", "us-central1", "europe-west4", "europe-west1")), text
