"""The flow loop linearised around an equilibrium, with the lead on the workload trend (research/theory.md,
"Batched servers: the lead must reach the crossover").

Why a separate model: the fluid model's queue relaxes by itself (μ' > 0 everywhere), and it did not show
the lightly damped loop the simulator's batched cells run into at 95 % load, where the queue's relaxation
time T = 1/μ' is thousands of seconds. Linearised, one cell's loop is

    L(s) = K · e^{−sτ} · (1 + s(H + σ)) / (s · (1 + sT) · (1 + sσ))

K = κ/τ̄ the step's gain (the integrator), τ the real feedback delay, T the queue's lag, H the lead
and σ the smoothing of the trend it extrapolates. Its phase margin says how well the loop is damped.
"""

from __future__ import annotations

import numpy as np

from dlb.core.flow import FlowConfig, lead_horizon


def open_loop(w: np.ndarray, k: float, tau: float, relax: float, lead: float, smooth: float) -> np.ndarray:
    """L(jω) of the loop above at the angular frequencies ``w`` (rad/s)."""
    s = 1j * np.asarray(w, float)
    return k * np.exp(-s * tau) * (1 + s * (lead + smooth)) / (s * (1 + s * relax) * (1 + s * smooth))


def phase_margin(k: float, tau: float, relax: float, lead: float, smooth: float) -> tuple[float, float]:
    """(crossover ω_c in rad/s, phase margin in radians) of :func:`open_loop`; margin ≤ 0: unstable."""
    w = np.logspace(-6, 3, 40000)
    mag = np.abs(open_loop(w, k, tau, relax, lead, smooth))
    i = int(np.argmax(mag < 1.0))
    # The phase of L, unwrapped from the integrator's −π/2 at low frequency.
    phase = np.unwrap(np.angle(open_loop(w[: i + 1], k, tau, relax, lead, smooth)))
    return float(w[i]), float(np.pi + phase[-1])


def step_response(k: float, tau: float, relax: float, lead: float, smooth: float, horizon_s: float,
                  dt: float = 0.01) -> np.ndarray:
    """The cell's cost deviation after a unit step of extra inflow at t = 0: the loop above, closed.

    Units of steady-state cost (g = 1): the queue moves the cost n towards the inflow deviation u + 1
    with time constant T, the trend r is dn/dt smoothed over σ, and the integrator moves u against the
    led cost ``n + H·r`` seen τ late. n → 0 when the loop has moved the extra inflow away.
    """
    steps = int(round(horizon_s / dt))
    lag = max(0, int(round(tau / dt)))
    n, r, u = 0.0, 0.0, 0.0
    seen = [0.0] * (lag + 1)  # ring of the led cost, oldest first
    out = np.empty(steps)
    for t in range(steps):
        dn = (u + 1.0 - n) / relax
        n += dt * dn
        r += dt * (dn - r) / smooth
        seen.append(n + lead * r)
        u -= dt * k * seen.pop(0)
        out[t] = n
    return out


def ring_ratio(y: np.ndarray) -> float:
    """Largest |extremum| of ``y`` after its first half-cycle ÷ the first one's (0: no overshoot; ≥ 1: the
    oscillation does not decay). A damped loop's second half-cycle is e^{−πζ/√(1−ζ²)} of its first."""
    cross = np.flatnonzero(np.diff(np.sign(y)) != 0) + 1
    peaks = [float(np.abs(seg).max()) for seg in np.split(y, cross) if len(seg)]
    return max(peaks[1:], default=0.0) / peaks[0] if peaks and peaks[0] > 0 else 0.0


#: Relaxation times (s) of the ``loop`` table: 10 s is a cell near its knee, thousands of seconds a
#: batched cell at 95 % (1/μ' read from its fitted model in the simulator, research/theory.md).
LOOP_RELAX_S = (10.0, 100.0, 1000.0, 3000.0)


def loop_table(delay_s: float = 0.3, kappa: float = 1.0, smooth_s: float = 1.0) -> list[tuple[float, str, float, float, float]]:
    """(T, rule, lead H, phase margin in degrees, ring ratio) for no lead, the fixed 5-s lead and the
    lag-aware lead (``lead_gain`` 1), at the worst real delay the step allows (τ = τ̄)."""
    rules = {"no lead": FlowConfig(kappa=kappa, lead_s=0.0), "fixed lead": FlowConfig(kappa=kappa),
             "lag-aware lead": FlowConfig(kappa=kappa, lead_gain=1.0)}
    k = kappa / delay_s
    out = []
    for relax in LOOP_RELAX_S:
        for name, cfg in rules.items():
            lead = float(lead_horizon(np.array([relax]), delay_s, cfg)[0])
            wc, pm = phase_margin(k, delay_s, relax, lead, smooth_s)
            y = step_response(k, delay_s, relax, lead, smooth_s, horizon_s=6 * 2 * np.pi / wc, dt=0.02)
            out.append((relax, name, lead, float(np.degrees(pm)), ring_ratio(y)))
    return out
