"""The linearised flow loop of ``dlb theory --set loop``: a slow queue behind the step (research/theory.md,
"Batched servers: the lead must reach the crossover")."""

from __future__ import annotations

import numpy as np

from dlb.core.flow import FlowConfig, lead_horizon
from dlb.theory.loop import loop_table, phase_margin, ring_ratio, step_response

TAU = 0.3  # τ̄ of a root 100 ms from its cells, stepping every 0.2 s; the real delay taken as τ̄ (worst case)


def _ring(relax: float, cfg: FlowConfig) -> tuple[float, float]:
    lead = float(lead_horizon(np.array([relax]), TAU, cfg)[0])
    wc, pm = phase_margin(1.0 / TAU, TAU, relax, lead, cfg.lead_smoothing_s)
    return float(np.degrees(pm)), ring_ratio(step_response(1.0 / TAU, TAU, relax, lead, cfg.lead_smoothing_s, 12 * np.pi / wc, 0.02))


def test_on_a_slow_queue_the_fixed_lead_rings_and_the_lag_aware_lead_damps() -> None:
    """T = 1000 s (a batched cell at 95 %): without a lead the loop does not decay; the fixed 5-s lead
    leaves each half-cycle at ~0.6 of the last; the lag-aware lead cuts it to ~0.15."""
    none_pm, none_ring = _ring(1000.0, FlowConfig(lead_s=0.0))
    fixed_pm, fixed_ring = _ring(1000.0, FlowConfig())
    aware_pm, aware_ring = _ring(1000.0, FlowConfig(lead_gain=1.0))
    assert none_ring >= 1.0 and abs(none_pm) < 1.0
    assert fixed_ring > 0.5 and fixed_pm < 20.0
    assert aware_ring < 0.2 and aware_pm > 45.0


def test_ring_ratio_reads_a_decaying_oscillation() -> None:
    t = np.linspace(0.0, 10.0, 10001)
    assert ring_ratio(np.exp(-t) * np.cos(np.pi * t)) < 0.5
    assert ring_ratio(np.exp(-t)) == 0.0
    assert ring_ratio(np.sin(np.pi * t + 0.1)) > 0.99


def test_loop_table_lag_aware_rows_are_damped_from_100_s_up() -> None:
    rows = [r for r in loop_table() if r[1] == "lag-aware lead" and r[0] >= 100]
    assert rows and all(pm >= 40 and ring <= 0.2 for _, _, _, pm, ring in rows)
