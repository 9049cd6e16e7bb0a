"""The demo's report folder: ``results.json``, ``requests.jsonl``, ``report.md`` and PNG plots.

Every number comes from the run's own per-request results (which cell served a request is the
``x-dlb-server`` header the emulator set, named ``<cell>/<k>``) and the control plane samples; the
git commit that produced them is recorded. Time buckets use the request's *scheduled* send time, so
a bucket's share says where the requests that arrived then were sent.

The degradation verdict (``degradation`` in results.json) compares the degraded cell's share of
requests in three windows, each skipping a reaction time of 10 % of the run after a change:
before = [10 %, degrade start), during = [degrade start + 10 %, recovery), after = [recovery + 10 %, end).
``fell`` = during < 0.8 × before; ``came_back`` = after > during + (before − during) / 3. A third, not half:
two healthy windows of one 90-s run differ by up to 0.10 in share (the roots learn the other cells'
slopes while the degraded one is avoided, so "before" sits on a less informed split), which is as
large as half of a 3× slowdown's drop (0.13–0.22).
A window an interrupted run did not reach to its end has no share, and the verdicts needing it are
null ("not measured"), not False.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlb import provenance
from dlb.load.generator import CUT, Result, quantile, summarize, write_results

if TYPE_CHECKING:
    from dlb.testbed.demo_run import DemoRun

BUCKET_S = 5.0
REACTION = 0.10  # fraction of the run skipped after each change


@functools.lru_cache(maxsize=1)
def git_commit() -> dict[str, Any]:
    """HEAD and whether tracked files differ from it (:func:`dlb.provenance.git_commit`) — read once per
    process: call it at the start of a run."""
    sha, _, dirty = provenance.git_commit().partition("+")
    return {"commit": None, "dirty": None} if sha == "unknown" else {"commit": sha, "dirty": bool(dirty)}


def cell_of(r: Result) -> str:
    return r.server.rpartition("/")[0]


def share_in(results: list[Result], cell: str, lo: float, hi: float) -> float:
    served = [r for r in results if lo <= r.t < hi and r.server]
    return sum(1 for r in served if cell_of(r) == cell) / len(served) if served else math.nan


def run_end(run: DemoRun) -> float:
    """Seconds of the workload the run covered: its duration, or where an interruption stopped it."""
    return run.spec.duration_s if run.stopped_s is None else min(run.spec.duration_s, run.stopped_s)


def degradation(run: DemoRun) -> dict[str, Any] | None:
    """The verdict; a window the run did not reach to its end (an interrupted run) has no share (NaN),
    and a verdict needing it is None (not measured) rather than False."""
    if run.degrade_window is None or run.degrade_cell is None:
        return None
    d, end, cell = run.spec.duration_s, run_end(run), run.degrade_cell
    a, b = run.degrade_window

    def share(lo: float, hi: float) -> float:
        return share_in(run.results, cell, lo, hi) if hi <= end else math.nan

    before = share(REACTION * d, a)
    during = share(a + REACTION * d, b)
    after = share(b + REACTION * d, d)
    fell = None if math.isnan(before) or math.isnan(during) else bool(during < 0.8 * before)
    back = None if fell is None or math.isnan(after) else bool(after > during + (before - during) / 3)
    return {"cell": run.degrade_cell, "slowdown": run.fleet.degrade_slowdown, "window_s": [a, b],
            "share_before": before, "share_during": during, "share_after": after, "fell": fell, "came_back": back}


def per_cell(results: list[Result], cells: list[str]) -> dict[str, dict[str, Any]]:
    out = {}
    for c in cells:
        rs = [r for r in results if cell_of(r) == c]
        ok = [r for r in rs if r.ok]
        out[c] = {"requests": len(rs), "ok": len(ok), "p50_s": quantile([r.latency_s for r in ok], 0.5),
                  "p90_s": quantile([r.latency_s for r in ok], 0.9), "ttft_p50_s": quantile([r.ttft_s for r in ok], 0.5)}
    return out


def timeline(results: list[Result], cells: list[str], duration: float) -> list[dict[str, Any]]:
    rows = []
    n = max(1, int(math.ceil(duration / BUCKET_S)))
    for k in range(n):
        lo, hi = k * BUCKET_S, (k + 1) * BUCKET_S
        rs = [r for r in results if lo <= r.t < hi]
        served = [r for r in rs if r.server]
        row: dict[str, Any] = {"t": lo, "requests": len(rs), "errors": sum(1 for r in rs if not r.ok), "cells": {}}
        for c in cells:
            mine = [r for r in served if cell_of(r) == c]
            ok = [r.latency_s for r in mine if r.ok]
            row["cells"][c] = {"share": len(mine) / len(served) if served else math.nan,
                               "p50_s": quantile(ok, 0.5), "p90_s": quantile(ok, 0.9)}
        rows.append(row)
    return rows


def _nan_to_none(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_nan_to_none(v) for v in x]
    return x


def plots(run: DemoRun, tl: list[dict[str, Any]], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = list(run.servers)
    t = [row["t"] + BUCKET_S / 2 for row in tl]
    made = []
    for key, fname, ylabel in (("share", "share_over_time.png", "share of requests"),
                               ("p50_s", "latency_over_time.png", "p50 latency (s)")):
        fig, ax = plt.subplots(figsize=(8, 4))
        for c in cells:
            ax.plot(t, [row["cells"][c][key] for row in tl], marker="o", ms=3, label=c)
        if run.degrade_window:
            ax.axvspan(*run.degrade_window, color="red", alpha=0.1, label=f"{run.degrade_cell} degraded")
        ax.set_xlabel("scheduled send time (s)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=100)
        plt.close(fig)
        made.append(fname)
    fig, ax = plt.subplots(figsize=(6, 4))
    for c in cells:
        xs = sorted(r.latency_s for r in run.results if r.ok and cell_of(r) == c)
        if xs:
            ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=c)
    xs = sorted(r.latency_s for r in run.results if r.ok)
    if xs:
        ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], "k--", label="all")
    ax.set_xlabel("latency (s)")
    ax.set_ylabel("CDF")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "latency_cdf.png", dpi=100)
    plt.close(fig)
    made.append("latency_cdf.png")
    return made


def _pct(x: float) -> str:
    return "not reached" if math.isnan(x) else f"{x:.1%}"


def _verdict(v: bool | None) -> str:
    return "not measured" if v is None else str(v)


def write_report(run: DemoRun, out: Path) -> str:
    """Write the folder; returns the summary table as text (printed at the end of the demo)."""
    cells = list(run.servers)
    summary = summarize(run.results, run.spec.duration_s)
    done = [r for r in run.results if r.error != CUT]  # an interruption's cut requests are not failures
    pc = per_cell(done, cells)
    tl = timeline(done, cells, run.spec.duration_s)
    deg = degradation(run)
    doc = {
        **git_commit(), "policy": run.policy, "interrupted": run.interrupted,
        "fleet": asdict(run.fleet), "capacity_rps": run.capacity, "workload": asdict(run.spec),
        "summary": summary, "cells": pc, "degradation": deg, "timeline": tl,
        "samples": [{"t": s.t, "fleet": s.fleet, "decisions": s.decisions} for s in run.samples],
        "supervisor_events": [list(e) for e in run.events],
    }
    (out / "results.json").write_text(json.dumps(_nan_to_none(doc), indent=1))
    write_results(run.results, out / "requests.jsonl")
    try:
        images = plots(run, tl, out)
    except Exception as e:  # plots are a convenience; the numbers are in results.json
        images = []
        print(f"dlb demo: plots failed: {e}")
    lines = ["| cell | servers | requests | share | ok | p50 s | p90 s | TTFT p50 s |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    served = sum(v["requests"] for v in pc.values()) or 1
    for c in cells:
        v = pc[c]
        lines.append(f"| {c} | {len(run.servers[c])} | {v['requests']} | {100 * v['requests'] / served:.0f}% | {v['ok']} | "
                     f"{v['p50_s']:.2f} | {v['p90_s']:.2f} | {v['ttft_p50_s']:.2f} |")
    lines.append(f"| **all** | {sum(len(v) for v in run.servers.values())} | {summary['requests']} | | {summary['ok']} "
                 f"({100 * summary['success_rate']:.1f}%) | {summary['p50_s']:.2f} | {summary['p90_s']:.2f} | "
                 f"{summary['ttft_p50_s']:.2f} |")
    table = "\n".join(lines)
    md = ["# dlb demo report", "",
          f"Commit `{doc['commit']}`{' (dirty tree)' if doc['dirty'] else ''}; policy: {run.policy}; "
          f"{summary['requests']} requests over {run_end(run):.0f}s at {run.spec.rate_rps:.1f} req/s "
          f"(capacity {sum(run.capacity.values()):.1f} req/s, computed from the server profiles)"
          + (f"; **interrupted** ({summary['cut']} requests then in flight left out)" if run.interrupted else "")
          + ".", "", table, ""]
    if deg:
        md += [f"Degradation: {deg['cell']} servers {deg['slowdown']:g}× slower during "
               f"{deg['window_s'][0]:.0f}–{deg['window_s'][1]:.0f}s. Its share of requests: before {_pct(deg['share_before'])}, "
               f"during {_pct(deg['share_during'])}, after {_pct(deg['share_after'])} "
               f"(fell: {_verdict(deg['fell'])}, came back: {_verdict(deg['came_back'])}; rule in dlb/testbed/report.py).", ""]
    md += [f"![{i}]({i})" for i in images]
    md += ["", "Per-request results: `requests.jsonl`; everything above and the control-plane samples: `results.json`; "
           "component logs: `logs/`."]
    (out / "report.md").write_text("\n".join(md) + "\n")
    return table
