"""The batched server model's results are pinned: small batched runs must reproduce, bit for bit, the
per-request latencies, destinations and counts that the engine produced before its hot path was
restructured (``sim_batched_reference.json``). Speed work on the engine may change how the numbers
are computed, never the numbers.

The runs go through scipy's least-squares fit, whose last bits follow the BLAS kernels OpenBLAS
picks for the CPU (a fresh AMD machine without AVX-512 diverged on 2 of 5 cases), so they run in a
subprocess pinned to the generic Nehalem kernels and numpy's baseline SIMD: the same bits on any
x86-64 machine with the same library versions.

Regenerate (only for a deliberate change of the model, and say so in the commit):
``python tests/integration/test_sim_batched_reference.py``. The library versions the bits hold
for are recorded beside them and pinned in the ``test`` extra of pyproject.toml.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import replace
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from dlb.sim.engine import RunResult, SimConfig, simulate
from dlb.sim.scenario import Disruption, Scenario, Workload, generate

REFERENCE = Path(__file__).with_name("sim_batched_reference.json")


def _scenario(case: str) -> Scenario:
    """Each case exercises a different part of the engine: a loaded fleet (arrivals cutting runs),
    overload on a small KV cache (preemptions, KV-bounded admission, full queues), a cell slowing down mid-run (runs cut by
    a speed change)."""
    if case == "util95":
        return generate(101, duration_s=20, utilization=0.95, server_model="batched")
    if case == "small-kv":
        return generate(7, duration_s=20, utilization=1.3, server_model="batched",
                        workload=Workload(kv_cache_tokens=12_000, max_batch=24))
    if case == "slow-cell":
        sc = generate(3, duration_s=20, utilization=0.8, server_model="batched")
        return replace(sc, disruption=Disruption("slow", 6.0, 14.0, cell=0, factor=2.5))
    raise ValueError(f"unknown case {case!r}")


CASES = [("util95", "Disc-Lat"), ("util95", "Flow-Grad"), ("small-kv", "Rand"), ("small-kv", "Disc-RIF"),
         ("slow-cell", "Disc-Lat"), ("small-kv@cancel", "Rand"), ("small-kv@cancel", "Disc-RIF")]


def _digest(res: RunResult) -> dict:
    """What must not change: every served request's latency and every request's destination (hashed
    over their exact bytes), the counts, and a few latencies in clear for a readable failure."""
    lat = np.ascontiguousarray(res.latency, dtype=np.float64)
    return {
        "latency_sha256": hashlib.sha256(lat.tobytes()).hexdigest(),
        "routed_sha256": hashlib.sha256(np.ascontiguousarray(res.routed, dtype=np.int64).tobytes()).hexdigest(),
        "first_latencies": lat[:5].tolist(),
        "latency_sum": float(lat.sum()),
        "arrivals": res.arrivals, "completed": res.completed, "errors": res.errors, "overflow": res.overflow,
        "shed": res.shed, "in_flight": res.in_flight, "events": res.events, "preemptions": res.preemptions,
        "sim_time_s": res.sim_time_s, **({"cancelled": res.cancelled} if res.timeouts == "cancel" else {}),
    }


def _run(case: str, policy: str) -> dict:
    """The cases pinned before the simulator cancelled timed-out requests run with ``timeouts="serve"``
    (their bits did not change); ``@cancel`` runs the same scenario cancelling them (the default). All run
    without leaf admission and the roots' retry of refusals, as they were pinned (``tests/unit/test_admission.py``
    and ``tests/unit/test_sim_retry.py`` cover them)."""
    case, _, mode = case.partition("@")
    # A short request timeout bounds the waiting queues tightly, so the overloaded case overflows; cancelling,
    # 5 s lets a third of the requests finish and cancels others waiting, prefilling and decoding.
    timeout = (5.0 if mode else 0.3) if case == "small-kv" else SimConfig.request_timeout_s
    cfg = SimConfig(request_timeout_s=timeout, timeouts=mode or "serve", admission=False, cross_cell_retry=False)
    return _digest(simulate(_scenario(case), policy, config=cfg))


def _libraries() -> dict[str, str]:
    import scipy

    return {"numpy": np.__version__, "scipy": scipy.__version__}


def _run_all() -> dict:
    return {"libraries": _libraries(), **{f"{c}/{p}": _run(c, p) for c, p in CASES}}


def pinned_env() -> dict[str, str]:
    """The environment that makes the runs machine-independent: OpenBLAS's generic x86-64 kernels and
    none of numpy's SIMD dispatch above its baseline (both are read when the libraries load)."""
    from numpy._core._multiarray_umath import __cpu_dispatch__

    return {**os.environ, "OPENBLAS_CORETYPE": "Nehalem", "NPY_DISABLE_CPU_FEATURES": ",".join(__cpu_dispatch__)}


@cache
def _pinned_runs() -> dict:
    out = subprocess.run([sys.executable, __file__, "--print"], env=pinned_env(), capture_output=True, text=True,
                         timeout=600, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize(("case", "policy"), CASES)
def test_batched_runs_reproduce_the_reference_bit_for_bit(case: str, policy: str) -> None:
    ref = json.loads(REFERENCE.read_text())
    assert ref["libraries"] == _libraries(), (
        "the reference's bits hold for the library versions recorded with it (pinned in pyproject's test extra); "
        "install those, or regenerate it on purpose with `python tests/integration/test_sim_batched_reference.py`")
    assert _pinned_runs()[f"{case}/{policy}"] == ref[f"{case}/{policy}"]


def test_the_reference_exercises_preemption_and_overflow() -> None:
    """The pinned runs cover the engine's rare paths, so the comparison above can catch a change in them."""
    ref = json.loads(REFERENCE.read_text())
    assert ref["small-kv/Rand"]["preemptions"] > 0
    assert any(ref[f"{c}/{p}"]["overflow"] > 0 for c, p in CASES)
    assert all(ref[f"small-kv@cancel/{p}"][k] > 0 for p in ("Rand", "Disc-RIF") for k in ("cancelled", "preemptions", "overflow"))


if __name__ == "__main__":
    if sys.argv[1:] == ["--print"]:
        print(json.dumps(_run_all()))
    else:
        REFERENCE.write_text(json.dumps(_pinned_runs(), indent=1) + "\n")
