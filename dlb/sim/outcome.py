"""Latency figures that a policy cannot flatter by failing requests.

Success-only latency figures reward a policy that drops its slowest requests: a failed request leaves
the mean. Here every arrival counts: a served request at ``min(latency, timeout)`` (a client stops
waiting at the timeout, so a slower answer is a failure too), a failed, shed or never-finished request
at the timeout. Failing a request can then never lower the figure below serving it.

Records written before these fields existed are completed by :func:`complete` from what they hold.
"""

from __future__ import annotations

import math

import numpy as np

#: The simulator's request timeout (seconds): what a client waits for one completion. About 40× the
#: mean request's unloaded latency (≈ 1.4 s), 8× the worst pipeline p99 at 95 % load (7.5 s); a batched
#: server queues at most what it admits within it (:meth:`dlb.sim.scenario.Workload.max_waiting_tokens`).
#: Chosen before any run was scored with it; ``dlb sim --request-timeout`` changes it.
DEFAULT_REQUEST_TIMEOUT_S = 60.0

#: What the simulator does with a request whose client's timeout passed (``dlb sim --timeouts``):
#: ``cancel`` (the real path: the root Envoy's route timeout answers 504 and resets the stream, the
#: server aborts the request, freeing its slot and KV) or ``serve`` (it keeps its place until served,
#: and counts at the timeout: the simulator before cancelling).
TIMEOUT_MODES = ("cancel", "serve")

#: The new fields of a result record, in the order tables show them.
FIELDS = ("mean_latency_with_failures", "p90_latency_with_failures", "shed_rate", "overflow_rate", "refused_rate",
          "timed_out_rate", "request_timeout_s", "server_model")


def with_failures(latency: np.ndarray, failed: int, timeout_s: float) -> tuple[float, float]:
    """(mean, p90) over every request: ``latency`` of the served ones capped at ``timeout_s``, plus
    ``failed`` requests at ``timeout_s``. NaN when there was no request."""
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0: {timeout_s}")
    if failed < 0:
        raise ValueError(f"failed must be >= 0: {failed}")
    served = np.minimum(np.asarray(latency, float), timeout_s)
    n = served.size + failed
    if n == 0:
        return math.nan, math.nan
    mean = (float(served.sum()) + failed * timeout_s) / n
    p90 = float(np.quantile(np.concatenate([served, np.full(failed, timeout_s)]), 0.9))
    return mean, p90


def complete(rec: dict, timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S, server_model: str = "pipeline") -> dict:
    """Fill the fields of :data:`FIELDS` a record lacks (an older results file), in place.

    The failure-counting mean is derived from the success-only mean and the share of requests that
    did not finish, assuming no served request took longer than the timeout (true of every pipeline
    run: its queues hold seconds); the p90 only where the share settles it (none failed, or ≥ 10 %),
    else NaN (shown as n/a). Nothing before the field could shed, but NaN says "not recorded".
    ``server_model``: the model the record's run used if it does not say (the old default).
    """
    if "mean" not in rec:
        return rec
    rec.setdefault("server_model", server_model)
    if "timeouts" not in rec:  # from before the simulator cancelled: every request was served, however late
        rec["timeouts"] = "serve"
        rec.setdefault("cancelled_rate", 0.0)
    if "mean_latency_with_failures" in rec:
        rec.setdefault("client_failure_rate", _client_failures(rec))
        return rec
    t = float(rec.get("request_timeout_s", timeout_s))
    rec["request_timeout_s"] = t
    arrivals = rec.get("arrivals")
    err = float(rec.get("error_rate", math.nan))
    unfinished = float(rec.get("in_flight", 0)) / arrivals if arrivals else 0.0
    f = err + unfinished
    mean = float(rec["mean"]) if rec["mean"] is not None else math.nan
    if f >= 1.0:
        rec["mean_latency_with_failures"] = t
    else:
        rec["mean_latency_with_failures"] = (1.0 - f) * mean + f * t if math.isfinite(f) else math.nan
    p90 = float(rec.get("p90", math.nan))
    rec["p90_latency_with_failures"] = min(p90, t) if f == 0 else (t if f >= 0.1 else math.nan)
    rec.setdefault("shed_rate", math.nan)
    rec.setdefault("overflow_rate", math.nan)
    rec.setdefault("refused_rate", math.nan)
    rec.setdefault("timed_out_rate", math.nan)
    rec.setdefault("client_failure_rate", math.nan)
    rec["failure_figures_derived"] = True
    return rec


def _client_failures(rec: dict) -> float:
    """Errors + shed + timed out, / arrivals (NaN if the record lacks one of them)."""
    return float(sum(float(rec.get(f, math.nan)) for f in ("error_rate", "shed_rate", "timed_out_rate")))
