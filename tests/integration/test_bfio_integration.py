"""BF-IO's pure algorithm (dlb/core/bfio.py) against brute force and its own definitions.

Here: the tests that start dlb services, open sockets or run subprocesses;
the others: ``tests/unit/test_bfio.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations


def test_study_simulation_conserves_work_and_bfio_balances_better_than_jsq() -> None:
    from dlb.bench.bfio_study import Workload, simulate
    from dlb.emulator.profile import BUILTIN_PROFILES

    prof = BUILTIN_PROFILES["llama-8b-h100"]
    work = Workload.draw(4 * 16 * 2, seed=11, mean_decode=16.0, prompt_median=600.0, prompt_sigma=1.0)
    runs = {p: simulate(4, 16, p, 10 if p.startswith("bf-io") else None, work, prof, 16.0)
            for p in ("jsq", "bf-io", "bf-io-milp")}  # fmt: skip
    for r in runs.values():
        assert r.requests == len(work.prompts) and 0.0 <= r.idle_frac < 1.0
        # The same workload, so the same tokens; the step-time integral is what the policy changes.
        assert r.energy_proxy > 0 and r.mean_s <= r.p90_s
    assert runs["bf-io"].imbalance < runs["jsq"].imbalance
    assert runs["bf-io"].idle_frac < runs["jsq"].idle_frac
