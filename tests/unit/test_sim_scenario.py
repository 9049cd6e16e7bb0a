"""Scenario generator (Appendix B.1) and the region table."""

from __future__ import annotations

import numpy as np
import pytest

from dlb.sim.regions import REGIONS, great_circle_km, rtt_s, sample_cells
from dlb.sim.scenario import generate


def test_region_rtts_are_plausible() -> None:
    r = {x.name: x for x in REGIONS}
    # Iowa ↔ Belgium ≈ 7000 km great circle; public dashboards show ~100 ms RTT.
    assert great_circle_km(r["us-central1"], r["europe-west1"]) == pytest.approx(7000, rel=0.05)
    assert 0.08 < rtt_s(r["us-central1"], r["europe-west1"]) < 0.13
    assert rtt_s(r["europe-west1"], r["europe-west4"]) < 0.01


def test_sampled_cells_are_hierarchical_and_symmetric() -> None:
    for seed in range(30):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(2, 11))
        names, tau = sample_cells(rng, n)
        assert len(names) == len(set(names)) == n
        np.testing.assert_allclose(tau, tau.T)
        assert np.all(tau >= 0) and np.all(np.diag(tau) < 0.001)
        assert tau.max() < 0.2  # one-way, anywhere on Earth
    with pytest.raises(ValueError, match="n_cells"):
        sample_cells(np.random.default_rng(0), 0)


def test_generate_follows_appendix_b() -> None:
    counts, cells = [], []
    for seed in range(40):
        sc = generate(seed)
        cells.append(sc.n)
        counts.extend(sc.servers)
        assert 2 <= sc.n <= 10 and min(sc.servers) >= 1
        assert sc.demand.sum() == pytest.approx(0.8 * sc.capacity().sum())
        assert np.all(sc.demand > 0)
        # Serving latencies of hundreds of ms to seconds.
        assert 0.3 < sc.nominal_server_latency() < 5.0
    assert np.mean(counts) == pytest.approx(10, rel=0.15)
    assert min(cells) <= 3 and max(cells) >= 9


def test_variants_share_the_base_draw() -> None:
    a, b = generate(9), generate(9, utilization=0.5)
    assert a.names == b.names and a.servers == b.servers
    np.testing.assert_allclose(b.demand / a.demand, 0.5 / 0.8)
    y = generate(9, length_factor=10.0)
    np.testing.assert_allclose(y.decode_token_s * 10, a.decode_token_s)
    np.testing.assert_allclose(y.demand, 10 * a.demand)
    h = generate(9, homogeneous=True)
    assert np.ptp(h.decode_token_s) == 0


def test_bad_parameters_name_the_field() -> None:
    with pytest.raises(ValueError, match="utilization"):
        generate(1, utilization=0)
    with pytest.raises(ValueError, match="length_factor"):
        generate(1, length_factor=-1)
    with pytest.raises(ValueError, match="disruption"):
        generate(1, disruption="flood")
