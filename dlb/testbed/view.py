"""The demo's live terminal view (``rich``) and its plain-line fallback (``--no-live``, CI, pipes).

Both read the same things: the latest :class:`dlb.testbed.demo.Sample` (control plane ``/fleet`` and
the requests each root Envoy sent each cell) and the load generator's recent results. Per cell: servers, RIF,
traffic share from each source over the last 5 s (with a sparkline of the share over the run),
p50/p90 latency and TTFT p50 of the requests it finished in the last 10 s, the fitted latency model,
aversion, the completions flow weight, the error rate.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dlb.load.generator import LoadRunner
    from dlb.testbed.demo_run import DemoRun, Sample

SPARK = "▁▂▃▄▅▆▇█"
RECENT_S = 10.0
SHARE_WINDOW = 5


def _q(xs: list[float], q: float) -> float:
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def recent_by_cell(runner: LoadRunner, now: float) -> dict[str, list[Any]]:
    """Results finished in the last ``RECENT_S`` seconds, by serving cell (newest results are at the end)."""
    out: dict[str, list[Any]] = {}
    for r in reversed(runner.results[-2000:]):
        if r.t + r.latency_s < now - RECENT_S:
            break
        out.setdefault(r.server.rpartition("/")[0] or "?", []).append(r)
    return out


def shares(run: DemoRun, n: int = SHARE_WINDOW) -> dict[str, dict[str, float]]:
    """source -> cell -> share of the requests its root Envoys sent in the last ``n`` samples."""
    out: dict[str, dict[str, float]] = {}
    for s in run.samples[-n:]:
        for src, d in s.decisions.items():
            acc = out.setdefault(src, {})
            for cell, v in d.items():
                acc[cell] = acc.get(cell, 0.0) + v
    for src, acc in out.items():
        tot = sum(acc.values()) or 1.0
        out[src] = {k: v / tot for k, v in acc.items()}
    return out


def share_series(run: DemoRun, cell: str, width: int = 24) -> str:
    """Sparkline of ``cell``'s share of every root's sends, one character per sample (last ``width``)."""
    chars = []
    for s in run.samples[-width:]:
        tot = sum(sum(d.values()) for d in s.decisions.values())
        v = sum(d.get(cell, 0.0) for d in s.decisions.values()) / tot if tot else 0.0
        chars.append(SPARK[min(len(SPARK) - 1, int(v * len(SPARK)))])
    return "".join(chars)


def _fmt_s(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.2f}"


def cell_rows(run: DemoRun, sample: Sample, runner: LoadRunner) -> list[dict[str, str]]:
    now = runner.clock() - runner.t0
    recent = recent_by_cell(runner, now)
    sh = shares(run)
    flow = sample.fleet.get("flow_weights", {}).get("completions", {})
    rows = []
    for cell in run.servers:
        st = sample.fleet.get("cells", {}).get(cell, {})
        rs = [r for r in recent.get(cell, []) if r.ok]
        model = st.get("model") or {}
        row = {
            "cell": cell + (" (degraded)" if _degraded(run, now) and cell == run.degrade_cell else ""),
            "servers": str(len(run.servers[cell])),
            "rif": "-" if st.get("rif") is None else f"{st['rif']:.0f}",
            "p50": _fmt_s(_q([r.latency_s for r in rs], 0.5)),
            "p90": _fmt_s(_q([r.latency_s for r in rs], 0.9)),
            "ttft": _fmt_s(_q([r.ttft_s for r in rs], 0.5)),
            "model": f"a={model['a_s']:.2f} b={model['b_s']:.3f}" if model else "-",
            "aversion": f"{st.get('aversion', 0.0):.2f}",
            "errors": f"{100 * (st.get('error_rate') or 0.0):.1f}%",
            "trend": share_series(run, cell),
        }
        for src in sh:
            row[f"from {src}"] = f"{100 * sh[src].get(cell, 0.0):.0f}%"
        for src, w in flow.items():
            row[f"w {src}"] = f"{w.get(cell, 0.0):.2f}"
        rows.append(row)
    return rows


#: Columns a narrow terminal drops first, in this order: every column squeezed to "us…" left the cells
#: impossible to tell apart in 80 columns.
DROP_FIRST = ("trend", "model", "ttft", "aversion", "servers", "p90")


def fit_columns(rows: list[dict[str, str]], width: int) -> list[str]:
    """The columns of ``rows`` that fit ``width`` characters unsqueezed, dropping :data:`DROP_FIRST` in order."""
    cols = list(rows[0]) if rows else []

    def need(cs: list[str]) -> int:  # rich's box: a border and one space each side per column
        return 1 + sum(3 + max(len(c), *(len(r[c]) for r in rows)) for c in cs)

    for c in DROP_FIRST:
        if need(cols) <= width:
            break
        if c in cols:
            cols.remove(c)
    return cols


def _degraded(run: DemoRun, now: float) -> bool:
    return run.degrade_window is not None and run.degrade_window[0] <= now < run.degrade_window[1]


def headline(run: DemoRun, sample: Sample, runner: LoadRunner) -> str:
    now = runner.clock() - runner.t0
    state = "degraded" if _degraded(run, now) else ("recovered" if run.degrade_window and now >= run.degrade_window[1] else "normal")
    okp = 100.0 * sample.ok / sample.done if sample.done else 100.0
    # After the load's end the run waits for the requests in flight: say so (it read "t= 46.0/30s").
    clock = (f"t={now:5.1f}/{run.spec.duration_s:.0f}s" if now <= run.spec.duration_s
             else f"t={now:5.1f}s, load ended at {run.spec.duration_s:.0f}s, draining")
    return (f"{clock}  offered {run.spec.rate_rps:.1f} req/s  sent {runner.sent}  "
            f"done {sample.done}  ok {okp:.1f}%  in flight {runner.in_flight}  fleet: {state}")


class PlainView:
    """One line every 5 s: headline, then per cell share and p50."""

    def __init__(self, run: DemoRun) -> None:
        self.run = run
        self.last = -1e9

    def __enter__(self) -> PlainView:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, sample: Sample, runner: LoadRunner) -> None:
        if sample.t - self.last < 5.0:
            return
        self.last = sample.t
        parts = []
        for row in cell_rows(self.run, sample, runner):
            src = [v for k, v in row.items() if k.startswith("from ")]
            p50 = row["p50"] if row["p50"] == "-" else f"{row['p50']}s"  # "-": nothing finished there yet
            parts.append(f"{row['cell']}: rif {row['rif']} share {'/'.join(src)} p50 {p50}")
        print(headline(self.run, sample, runner) + " | " + " | ".join(parts), flush=True)


class RichView:
    """A ``rich.live.Live`` table redrawn once per sample."""

    def __init__(self, run: DemoRun, events: list[tuple[float, str, str]]) -> None:
        from rich.console import Console
        from rich.live import Live

        self.run = run
        self.events = events  # the supervisor's state changes (shown under the table)
        self.console = Console()
        self.live = Live(console=self.console, refresh_per_second=2, transient=False)

    def __enter__(self) -> RichView:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)

    def update(self, sample: Sample, runner: LoadRunner) -> None:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        rows = cell_rows(self.run, sample, runner)
        table = Table(title="DLB demo — per cell (share: last 5 s of what each root Envoy sent; latency: last 10 s)", expand=False)
        cols = fit_columns(rows, self.console.width)
        for c in cols:
            table.add_column(c, justify="left" if c in ("cell", "trend", "model") else "right")
        for row in rows:
            style = "bold red" if "degraded" in row["cell"] else None
            table.add_row(*[row[c] for c in cols], style=style)
        events = [f"[{t:6.1f}s] {who}: {what}" for t, who, what in self.events[-4:]]
        self.live.update(Group(Text(headline(self.run, sample, runner), style="bold"), table, Text("\n".join(events))))
