"""``dlb bench faults``, CI-sized: two faults of the matrix under 20 req/s, through real Envoys.

Each assertion is a count of requests (never a time): a dead server behind Envoy's LEAST_REQUEST
costs no request sent after it died (safe retries + outlier detection + health checks), and killing a
leaf agent costs no request at all. ``recover_s`` only has to exist (the cell gets its traffic back
within the run); the speed targets live in the benchmark's verdicts.
"""

from __future__ import annotations

import pytest

from dlb.bench.faults import Sample, _TraceConn, summarise, verdict

pytestmark = pytest.mark.timeout(240)


def test_summary_counts_and_verdict_rules() -> None:
    s = [Sample(0.5, 0.6, 200, "a-0"), Sample(2.0, 2.1, 200, "a-0"), Sample(2.5, 2.7, 200, "b-0"),
         Sample(2.9, 3.5, 0, ""),  # in flight at the fault (t = 3), cut
         Sample(3.2, 3.3, 503, ""), Sample(3.6, 3.7, 200, "b-1"),  # one new failure 0.2 s after the fault
         Sample(6.1, 6.2, 200, "a-1"), Sample(6.6, 6.7, 200, "a-0"), Sample(7.2, 7.3, 200, "a-0")]
    row = summarise(s, "server", "least_request", 1.0, fault_at=3.0, restore_at=6.0)
    assert (row["sent"], row["ok"], row["failed"], row["inflight_at_fault"], row["cut_streams"]) == (9, 7, 2, 1, 1)
    assert row["failed_new"] == 1 and row["new_fail_window_s"] == pytest.approx(0.2) and row["detect_s"] == pytest.approx(0.2)
    assert row["pre_share"] == pytest.approx(0.5) and row["recover_s"] == 0.0 and row["verdict"] == "pass"
    assert verdict(dict(row, fault="root_service")).startswith("fail: 2 failed")
    assert "recover_s None" in verdict(dict(row, recover_s=None))


def test_a_root_envoy_replica_is_judged_from_when_its_killed_process_exited() -> None:
    """A SIGKILLed Envoy takes a few ms to be reaped; a request written to its kept-alive connection in
    that time went into its own socket (in flight on it), one written after it met no Envoy of it. The
    row's target counts only the second; ``failed_new`` still counts from the signal."""
    ok = [Sample(t / 10, t / 10 + 0.1, 200, "a-0", written=t / 10) for t in range(5, 60)]
    dying = Sample(3.004, 3.01, 0, "on a kept-alive connection", written=3.004)
    row = summarise([*ok, dying], "root_envoy_replica", "ext_proc", 10.0, fault_at=3.0, restore_at=4.0, exited_at=3.006)
    assert row["failed_new"] == 1 and row["failed_after_exit"] == 0 and row["exit_after_fault_s"] == pytest.approx(0.006)
    assert row["failed_written_after_fault_s"] == [pytest.approx(0.004)]
    assert row["verdict"] == "pass"
    # Scheduled before the exit but written after it (a busy client loop): after.
    late = Sample(3.005, 3.02, 0, "on a kept-alive connection", written=3.0065)
    row = summarise([*ok, late], "root_envoy_replica", "ext_proc", 10.0, fault_at=3.0, restore_at=4.0, exited_at=3.006)
    assert row["failed_after_exit"] == 1 and "1 requests written after the killed Envoy exited" in row["verdict"]
    # Without the exit time (an older caller) the signal is the line, as before.
    assert "written after" in summarise([*ok, dying], "root_envoy_replica", "ext_proc", 10.0, fault_at=3.0, restore_at=4.0)["verdict"]


class _Transport:
    def write(self, data: bytes) -> None:
        pass


def _answers(chunks: list[bytes], lose: bool = False) -> list[tuple[int, str]]:
    """Feed raw response bytes to a trace connection with two requests pending; what each got."""
    import asyncio

    async def go() -> list[tuple[int, str]]:
        c = _TraceConn()
        c.connection_made(_Transport())  # type: ignore[arg-type]
        futs = [c.send(b"r1"), c.send(b"r2")]
        for chunk in chunks:
            c.data_received(chunk)
        if lose:
            c.connection_lost(None)
        return [f.result() if f.done() else (-2, "pending") for f in futs]

    return asyncio.run(go())


STREAM_HEAD = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nx-dlb-server: a-1\r\n\r\n"


def test_trace_client_tells_a_whole_stream_from_a_cut_one() -> None:
    """A stream is complete only with its terminal chunk and ``data: [DONE]``; split anywhere, it parses."""
    whole = STREAM_HEAD + b"c\r\ndata: {\"x\"}\n\r\n" + b"d\r\ndata: [DONE]\n\r\n" + b"0\r\n\r\n"
    after = b"HTTP/1.1 503 x\r\ncontent-length: 21\r\n\r\n{\"error\":{\"code\":\"z\"}}"
    raw = whole + after
    assert _answers([raw]) == [(200, "a-1"), (503, "z")]
    assert _answers([raw[k:k + 7] for k in range(0, len(raw), 7)]) == [(200, "a-1"), (503, "z")]
    early = STREAM_HEAD + b"c\r\ndata: {\"x\"}\n\r\n" + b"0\r\n\r\n"  # ended without [DONE]: an emulator stopping
    assert _answers([early])[0] == (0, "no [DONE]")
    cut = STREAM_HEAD + b"c\r\ndata: {\"x\"}\n\r\n"  # Envoy resets the client mid-body: a server died
    assert _answers([cut], lose=True) == [(0, "cut after 200"), (0, "")]


def test_leaf_envoy_and_overload_verdicts_and_the_spread_of_three_runs() -> None:
    """A killed leaf Envoy may cost only streams already answering; an overloaded cell at most 1 % and none
    of its servers; three runs are one row of min/median/max that passes only if every run does."""
    from dlb.bench.faults import spread

    s = [Sample(0.5, 0.6, 200, "a-0"), Sample(2.0, 2.1, 200, "a-0"), Sample(2.9, 3.5, 0, "cut after 200"),
         Sample(6.1, 6.2, 200, "a-1"), Sample(7.2, 7.3, 200, "a-0")]
    row = summarise(s, "leaf_envoy", "ext_proc", 1.0, fault_at=3.0, restore_at=6.0)
    assert row["verdict"] == "pass"
    lost = summarise([*s, Sample(3.1, 3.2, 503, "no_healthy_upstream")], "leaf_envoy", "ext_proc", 1.0, 3.0, 6.0)
    assert lost["verdict"].startswith("fail: 1 failed before their answer started")
    over = dict(row, fault="cell_overload", envoy_min_healthy=1, servers_a=2)
    assert verdict(over) == "fail: 1 of 5 failed (target <= 1 %); the leaf Envoy kept only 1 servers"
    r = spread([dict(row, policy="Flow-Grad", recover_s=x) for x in (0.0, 2.0, 1.0)])
    assert r["recover_s"] == [0.0, 1.0, 2.0] and r["sent"] == [5, 5, 5] and r["verdict"] == "pass" and r["runs"] == 3
    assert spread([row, dict(lost, policy="Disc-RIF"), dict(row, recover_s=None)])["recover_s"] is None


def test_a_freeze_counts_what_waited_for_it_and_how_long_new_requests_still_went_there() -> None:
    """Frozen from t = 3 to 13: requests sent early in the freeze that ended after the thaw waited on it;
    the last of them sent at 5.5 is the root's detection (2.5 s after the freeze). A request sent too
    near the thaw to tell (a long stream may last that long) is not counted."""
    from dlb.bench.faults import FREEZE_DETECT_S, stalls

    s = [Sample(3.2, 13.4, 200, "a-0"), Sample(5.5, 13.6, 200, "a-1"), Sample(6.0, 6.1, 200, "a-0"),
         Sample(9.0, 13.2, 200, "a-0"), Sample(2.9, 3.1, 200, "b-0"), Sample(13.5, 13.6, 200, "a-1"), Sample(14.6, 14.7, 200, "b-0")]
    got = stalls(s, fault_at=3.0, restore_at=13.0)
    assert got == {"stalled": 2, "stall_window_s": 2.5}
    row = summarise(s, "leaf_replica_freeze", "ext_proc", 1.0, fault_at=3.0, restore_at=13.0, warmup_s=0.0)
    assert verdict(dict(row, **got)) == "pass"
    late = dict(row, stall_window_s=FREEZE_DETECT_S + 0.5)
    assert "waited on the frozen replica for 4.5 s" in verdict(late)


def test_policy_names_an_operator_baseline_or_a_dlb_policy() -> None:
    import argparse

    from dlb.bench.faults import run
    from dlb.errors import UsageError

    args = argparse.Namespace(faults="root_service", modes="ext_proc", policy="lr-global,hub-scor", runs=1, cells="2,2")
    with pytest.raises(UsageError, match=r"unknown policy 'hub-scor'; one of .*lr-global, locality-failover, hub-score"):
        run(args)


def test_native_runs_flow_policies_only() -> None:
    """``--native``: only a flow policy runs without a root service (a discrete one needs the root's picks)."""
    import argparse

    from dlb.bench.faults import run
    from dlb.errors import UsageError

    args = argparse.Namespace(faults="leaf_envoy", modes="least_request", policy="Flow-RIF,Disc-RIF", runs=1, cells="2,2", native=True)
    with pytest.raises(UsageError, match=r"--native: flow policies only \(Flow-Grad, Flow-Lat, Flow-RIF\), got Flow-RIF,Disc-RIF"):
        run(args)
