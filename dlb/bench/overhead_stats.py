"""Per-slice ratios, the A/A noise band and the CPU-budget verdicts of ``dlb bench overhead`` (pure).

Why ratios per slice: on a shared box the absolute cost of a request drifts by tens of per cent within
a minute, but a configuration and the floor measured back to back in one slice see the same drift, so
their ratio is stable. The floor is also measured twice in every slice (A and A'): the spread of A'/A
over the slices is the run's own noise band — a difference smaller than it is not a measured difference.

Budgets are committed per *machine kind* (architecture and CPU count: what sets the ratio, not the
speed) as the most CPU per request a configuration may cost, as a multiple of the floor's in the same
run. A configuration above its budget is a regression the bench names (exit 1).
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: The floor every ratio divides by: the constant-reply ext_proc on DLB's own transport.
FLOOR = "root-bare-h2"
#: Suffix of the floor's second measurement in each slice (the A/A pair).
AA_SUFFIX = "~aa"
#: The committed budgets (``dlb bench overhead --budgets`` defaults to it).
BUDGETS_FILE = Path(__file__).with_name("overhead_budgets.json")


def machine_kind() -> str:
    """``<arch>-<n>cpu``: budgets hold for machines of one kind, whatever their clock speed or load."""
    return f"{platform.machine()}-{os.cpu_count()}cpu"


@dataclass(frozen=True)
class SliceSample:
    """One configuration's figures in one slice: CPU seconds of the request path, requests, latency."""

    cpu_s: float
    requests: int
    p50_ms: float

    @property
    def cpu_ms_per_req(self) -> float:
        return self.cpu_s / self.requests * 1000 if self.requests else float("nan")


@dataclass(frozen=True)
class Ratio:
    """A configuration against the floor: the median over slices of the per-slice ratio, and the slices'."""

    median: float
    per_slice: tuple[float, ...]

    def as_json(self) -> dict[str, Any]:
        lo, hi = median_ci(self.per_slice)
        return {"median": round(self.median, 4), "ci95": [round(lo, 4), round(hi, 4)], "per_slice": [round(r, 4) for r in self.per_slice]}


def ratio(config: Sequence[SliceSample], floor: Sequence[SliceSample], field: str) -> Ratio:
    """``field`` (``cpu_ms_per_req`` or ``p50_ms``) of ``config`` over the floor's, slice by slice."""
    if len(config) != len(floor):
        raise ValueError(f"{len(config)} slices of the configuration but {len(floor)} of the floor")
    r = tuple(float(getattr(c, field)) / float(getattr(f, field)) if getattr(f, field) else float("nan")
              for c, f in zip(config, floor, strict=True))
    finite = [x for x in r if np.isfinite(x)]
    return Ratio(float(np.median(finite)) if finite else float("nan"), r)


def median_ci(values: Sequence[float], level: float = 0.95, draws: int = 2000) -> tuple[float, float]:
    """Bootstrap interval of the median of ``values`` (fixed seed: the same slices give the same band)."""
    x = np.asarray([v for v in values if np.isfinite(v)], dtype=float)
    if x.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(0)
    meds = np.median(rng.choice(x, size=(draws, x.size)), axis=1)
    tail = 100 * (1 - level) / 2
    return float(np.percentile(meds, tail)), float(np.percentile(meds, 100 - tail))


def noise_band(aa: Ratio) -> float:
    """Half-width of the A/A band: how far from 1 the median of A'/A reaches within its 95 % bootstrap
    interval. The floor against itself differs only by chance, so a configuration's median ratio is
    known to this precision (per-slice ratios scatter far more: a shared box's slices differ)."""
    lo, hi = median_ci(aa.per_slice)
    return max(abs(lo - 1.0), abs(hi - 1.0)) if np.isfinite(lo) else float("nan")


@dataclass(frozen=True)
class BudgetVerdict:
    """One configuration's CPU per request against its committed budget (``holds`` None: not measured)."""

    config: str
    budget: float
    measured: float | None
    band: float

    @property
    def holds(self) -> bool | None:
        if self.measured is None or not np.isfinite(self.measured):
            return None
        return self.measured <= self.budget

    def rule(self, floor: str, kind: str) -> str:
        return f"{self.config}: CPU per request <= {self.budget:g} x {floor}'s in the same run (budget for {kind})"

    def figure(self) -> str:
        if self.measured is None:
            return "not measured"
        return f"{self.measured:.3f} x (A/A noise band +-{self.band:.3f})"


def load_budgets(path: str | Path, kind: str) -> dict[str, float] | None:
    """The budgets of machine ``kind`` in ``path`` (None when the file has none for this kind).

    Shape: ``{kind: {"floor": "root-bare-h2", "budgets": {config: max ratio}}}``. A malformed file is an
    error naming the file and the field, never a silent pass.
    """
    p = Path(path)
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"{p}: cannot read the budgets file: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{p}: expected an object of machine kinds, got {type(raw).__name__}")
    entry = raw.get(kind)
    if entry is None:
        return None
    if not isinstance(entry, dict) or entry.get("floor", FLOOR) != FLOOR or not isinstance(entry.get("budgets"), dict):
        raise ValueError(f"{p}: {kind}: expected {{\"floor\": \"{FLOOR}\", \"budgets\": {{config: ratio}}}}")
    out: dict[str, float] = {}
    for config, value in entry["budgets"].items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{p}: {kind}.budgets.{config}: expected a positive number, got {value!r}")
        out[config] = float(value)
    return out


def budget_verdicts(budgets: Mapping[str, float], cpu_ratios: Mapping[str, Ratio], band: float) -> list[BudgetVerdict]:
    """One verdict per budgeted configuration that ran (the floor's own ratio is 1 by construction)."""
    out = []
    for config, budget in sorted(budgets.items()):
        if config not in cpu_ratios:
            continue
        out.append(BudgetVerdict(config, budget, cpu_ratios[config].median, band))
    return out
