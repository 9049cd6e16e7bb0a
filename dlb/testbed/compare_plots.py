"""Per-scenario plots of a ``dlb demo --compare`` folder: latency CDF per policy, each cell's share over time.

Read from each run's ``requests.csv`` (written by :mod:`dlb.testbed.compare`), so they can be drawn
again from a finished or resumed folder. Latencies as the comparison counts them: a failed or shed
request at the timeout. Cell shares are of the served requests, by scheduled send time in 5-s bins,
pooled over the scenario's trials.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import numpy as np

BIN_S = 5.0


def _rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "requests.csv").open() as f:
        return list(csv.DictReader(f))


def plot_scenario(out: Path, scenario: str, policies: list[str], timeout_s: float) -> list[Path]:
    """``OUT/<scenario>-latency-cdf.png`` and ``OUT/<scenario>-cell-share.png``; the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs: dict[str, list[list[dict[str, str]]]] = defaultdict(list)
    for policy in policies:
        for run_dir in sorted(out.glob(f"{scenario}-{policy}-t*")):
            if (run_dir / "requests.csv").exists():
                runs[policy].append(_rows(run_dir))
    if not runs:
        return []
    written = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy, trials in runs.items():
        lat = np.sort([float(r["latency_s"]) if 200 <= int(r["status"]) < 300 else timeout_s for rows in trials for r in rows])
        ax.plot(lat, np.arange(1, len(lat) + 1) / len(lat), label=f"{policy} ({len(trials)} trials)")
    ax.set_xscale("log")
    ax.set_xlabel("latency s (failed or shed = timeout)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"{scenario}: latency CDF")
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(out / f"{scenario}-latency-cdf.png")
    fig.savefig(written[-1], dpi=90)
    plt.close(fig)

    cells = sorted({r["cell"] for trials in runs.values() for rows in trials for r in rows if r["cell"]})
    fig, axes = plt.subplots(len(runs), 1, figsize=(7, 1.8 * len(runs) + 0.6), sharex=True, squeeze=False)
    for ax, (policy, trials) in zip(axes[:, 0], runs.items(), strict=True):
        served = [r for rows in trials for r in rows if r["cell"]]
        end = max((float(r["t"]) for r in served), default=0.0)
        edges = np.arange(0.0, end + BIN_S, BIN_S)
        total = np.histogram([float(r["t"]) for r in served], edges)[0].clip(min=1)
        bottom = np.zeros(len(edges) - 1)
        for cell in cells:
            share = np.histogram([float(r["t"]) for r in served if r["cell"] == cell], edges)[0] / total
            ax.bar(edges[:-1], share, BIN_S, bottom=bottom, align="edge", label=cell)
            bottom += share
        ax.set_ylabel(policy, fontsize=8)
        ax.set_ylim(0, 1)
    axes[0, 0].legend(fontsize=7, ncol=len(cells), loc="upper center", bbox_to_anchor=(0.5, 1.45))
    axes[-1, 0].set_xlabel("scheduled send time s")
    fig.tight_layout()
    written.append(out / f"{scenario}-cell-share.png")
    fig.savefig(written[-1], dpi=90)
    plt.close(fig)
    return written
