"""A cell with two leaf replicas (``cells[].leaf.replicas``): two leaf Envoys + agents over the same servers,
real Envoys and services on 127.0.0.1 (:func:`dlb.testbed.stack.start_data_plane`).

- The root Envoy sends to both replicas' Envoys; the root probes both agents and sees one cell whose
  RIF is the sum of theirs.
- Killing one replica (its Envoy and its agent at once) under load loses no request that had not
  started answering: requests reset on the dead Envoy are retried on the other replica, the root's
  cell stays usable (the dead replica leaves the aggregate, not the cell), and the root's RIF is the
  survivor's.

Properties are counted outcomes; waits are bounded polls.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from bounded_wait import until

from dlb.testbed.stack import DataPlane, metric_value, request, start_data_plane

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(180)]

ENDPOINT = {"name": "chat", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "discrete", "cost": "rif"},
            "latency_prior": {"a_s": 0.05, "b_s": 0.005, "c": 4, "s": 1}}


@pytest.fixture
def plane() -> Iterator[DataPlane]:
    from dlb.testbed.stack import CellSpec

    # fast-test at 1/5 speed: ~10 ms a token, so a 300-token answer stays in flight ~3 s.
    p = start_data_plane([CellSpec("a", servers=2, emulator={"time_scale": 5.0, "max_batch": 64})], "a", ENDPOINT,
                         leaf_ext_proc=True, leaf_replicas=2)
    try:
        # The Envoys start last: until the leaf Envoys' first health checks pass, the agents report 0
        # healthy servers and the root rightly answers "no usable cell" (what `dlb up` waits out before
        # it says ready). Traffic before that would count start-up, not replicas.
        until(lambda: _root(p, "dlb_root_cell_usable", endpoint="chat", cell="a") == 1.0, "cell a usable at the root", timeout=30)
        yield p
    finally:
        p.close()


def _metrics(url_port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{url_port}/metrics", timeout=5) as r:
        return r.read().decode()


def _leaf_rif(plane: DataPlane, live: int = 2) -> list[float]:
    agents = [plane.leaves["a"], *plane.more_leaves["a"]][:live]
    return [metric_value(_metrics(a.ready["metrics"]), "dlb_leaf_rif") or 0.0 for a in agents]


def _counter(text: str, name: str, **labels: str) -> float:
    """A counter's value (exported as ``<name>_total``)."""
    return metric_value(text, f"{name}_total", **labels) or metric_value(text, name, **labels) or 0.0


def _root(plane: DataPlane, name: str, **labels: str) -> float | None:
    return metric_value(plane.root_metrics(), name, **labels)


def _ask(plane: DataPlane, tokens: int, out: list[tuple[int, str]]) -> None:
    host, port = plane.root_url
    try:
        status, _, body = request(host, port, body={"model": "dlb-emulated", "max_tokens": tokens,
                                                    "messages": [{"role": "user", "content": "hi"}]}, timeout=60)
        out.append((status, "" if status == 200 else body.decode(errors="replace")[:200]))
    except (OSError, http.client.HTTPException) as e:
        out.append((0, repr(e)))


def _open_loop(stop: threading.Event, send: Callable[[], None], period_s: float) -> None:
    """``send`` in a thread of its own every ``period_s`` until ``stop``; then wait for all of them."""
    threads = []
    while not stop.is_set():
        t = threading.Thread(target=send)
        t.start()
        threads.append(t)
        time.sleep(period_s)
    for t in threads:
        t.join(60)


@contextlib.contextmanager
def _both_serving(plane: DataPlane, stop: threading.Event, *loops: Callable[[], None]) -> Iterator[None]:
    """Run ``loops`` (each until ``stop``) in threads; the body runs once both replicas have served a
    second under them; then stop and wait for the loops."""
    threads = [threading.Thread(target=f) for f in loops]
    for t in threads:
        t.start()
    try:
        until(lambda: all(r >= 1 for r in _leaf_rif(plane)), "both replicas serving under load", timeout=30)
        time.sleep(1.0)
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(90)


def test_both_replicas_serve_and_the_root_sums_their_rif(plane: DataPlane) -> None:
    results: list[tuple[int, str]] = []
    threads = [threading.Thread(target=_ask, args=(plane, 300, results)) for _ in range(8)]
    for t in threads:
        t.start()
    # Round robin over the two leaf Envoys: both hold some of the 8 long requests.
    until(lambda: all(r >= 1 for r in _leaf_rif(plane)), "both leaf replicas have requests in flight", timeout=30)

    def summed() -> bool:
        before = _leaf_rif(plane)
        root = _root(plane, "dlb_root_cell_rif", cell="a")
        return before == _leaf_rif(plane) and root == sum(before)  # read between two equal leaf readings

    until(summed, "the root's RIF of cell a equals the sum of its two replicas'", timeout=20, period=0.02)
    for t in threads:
        t.join(60)
    assert [s for s, _ in results] == [200] * 8, results
    leaves = [plane.leaves["a"], *plane.more_leaves["a"]]
    completed = [_counter(_metrics(a.ready["metrics"]), "dlb_leaf_completed") for a in leaves]
    assert all(c >= 1 for c in completed), completed  # each replica's agent measured what its Envoy served


def test_killing_one_replica_under_load_loses_nothing_not_yet_answering(plane: DataPlane) -> None:
    """Non-streamed requests answer only at the end, so every one the dead replica held was still
    retriable: the target is 0 failed, and the cell never unusable."""
    results: list[tuple[int, str]] = []
    stop = threading.Event()
    usable: list[float | None] = []

    def load() -> None:
        _open_loop(stop, lambda: _ask(plane, 40, results), 0.04)  # ~25 req/s, each ~0.4 s

    def watch() -> None:
        while not stop.is_set():
            usable.append(_root(plane, "dlb_root_cell_usable", endpoint="chat", cell="a"))
            time.sleep(0.1)

    with _both_serving(plane, stop, load, watch):
        plane.more_leaf_envoys["a"][0].proc.kill()  # one replica dies whole: its Envoy and its agent
        plane.more_leaves["a"][0].proc.kill()
        killed_at = len(results)
        time.sleep(4.0)
    failed = [r for r in results if r[0] != 200]
    assert len(results) - killed_at >= 50, "too little traffic after the kill to mean anything"
    assert failed == [], f"{len(failed)} of {len(results)} failed: {failed[:5]}"
    assert usable and all(u == 1.0 for u in usable), f"cell a not usable at some point: {usable}"
    # The dead replica left the aggregate: the root's RIF of the cell is the survivor's again.
    until(lambda: _root(plane, "dlb_root_cell_rif", cell="a") == _leaf_rif(plane, live=1)[0], "root RIF = the survivor's", timeout=10)
    # The root kept probing the dead replica and counts its failures (not the cell's).
    assert _counter(plane.root_metrics(), "dlb_root_probe_errors", cell="a") >= 1


def _check_latency(hp: tuple[str, int]) -> float:
    """One GET of the path the roots health-check a leaf Envoy on, seconds (a non-200 is a failure)."""
    from dlb.envoy.contract import LEAF_HEALTH_PATH

    t0 = time.monotonic()
    conn = http.client.HTTPConnection(*hp, timeout=5)
    try:
        conn.request("GET", LEAF_HEALTH_PATH)
        assert conn.getresponse().status == 200
    finally:
        conn.close()
    return time.monotonic() - t0


def test_the_roots_health_checks_are_not_requests_to_the_leaf(plane: DataPlane) -> None:
    """The leaf Envoy answers the roots' checks itself: none reaches the leaf ext_proc or the agent's
    count (the access log skips the path), however many arrive."""
    leaf, envoy = plane.leaves["a"], plane.leaf_envoys["a"]
    hp = plane.cfg.cell("a").leaf.address

    def counts() -> tuple[float, float]:  # (completions the agent counted, its picks: its own background probes)
        text = _metrics(leaf.ready["metrics"])
        return _counter(text, "dlb_leaf_completed"), sum(_counter(text, "dlb_leaf_server_picks", server=s.address)
                                                         for s in plane.emulators["a"])

    def ext_proc_streams() -> int:
        name = "cluster.dlb_leaf_ext_proc.upstream_rq_total"
        return int(envoy.stats(f"^{re.escape(name)}$")[name])

    ext0 = ext_proc_streams()
    for _ in range(20):
        _check_latency((hp.host, hp.port))
    time.sleep(1.0)  # two more rounds of the root's own checks, and the access log's flush
    done, picks = counts()
    assert done <= picks, f"the agent counted {done} completions for {picks} requests it picked a server for"
    # The agent's own background probes pass the ext_proc too (a few a second); the 20 checks would add 20.
    assert ext_proc_streams() - ext0 < 20


@pytest.mark.parametrize("frozen", ["envoy", "envoy+agent"])
def test_a_frozen_replica_is_taken_out_and_loses_nothing(plane: DataPlane, frozen: str) -> None:
    """SIGSTOP one replica's leaf Envoy (and its agent) under load for 6 s, then SIGCONT.

    A frozen Envoy still completes TCP handshakes (the kernel does), so only a check the Envoy must
    answer itself finds it: the root's HTTP check does within ~3 s. Requests sent to it before then wait
    for it to wake (reported, not retried: Envoy never resets them). Targets: 0 failed, the replica out
    of the root's rotation within 4 s, no request sent after that waits on it, and the live replica never out
    of rotation (its own answer to the check, timed under the same load, is reported beside the 1-s timeout;
    a box under load stretches it, so the test asserts what a stretched answer would cost, not a time).
    """
    import os
    import signal

    from dlb.envoy.host_health import hosts_out

    cell = plane.cfg.cell("a")
    live, stopped = (r.address for r in cell.leaf.all_replicas())
    procs = [plane.more_leaf_envoys["a"][0].proc] + ([plane.more_leaves["a"][0].proc] if "agent" in frozen else [])
    sent: list[tuple[float, float, int, str]] = []  # (sent, took, status, error)
    stop = threading.Event()
    check_s: list[float] = []

    def ask() -> None:
        t0 = time.monotonic()
        out: list[tuple[int, str]] = []
        _ask(plane, 20, out)
        sent.append((t0, time.monotonic() - t0, *out[0]))

    def load() -> None:
        _open_loop(stop, ask, 0.067)  # ~15 req/s, each ~0.2 s: the two servers' steady state, not a growing queue

    usable: list[float | None] = []
    live_out: list[float] = []  # when the root had the live replica out of rotation

    def rotation_out() -> set[str]:
        return hosts_out(plane.root_envoy.admin_get("/clusters?format=json"), cell.cluster_name)[1]

    def checks() -> None:
        while not stop.is_set():
            check_s.append(_check_latency((live.host, live.port)))
            usable.append(_root(plane, "dlb_root_cell_usable", endpoint="chat", cell="a"))
            if f"{live.host}:{live.port}" in rotation_out():
                live_out.append(time.monotonic())
            time.sleep(0.05)

    def out_of_rotation() -> bool:
        return f"{stopped.host}:{stopped.port}" in rotation_out()

    with _both_serving(plane, stop, load, checks):
        for p in procs:
            os.kill(p.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            until(out_of_rotation, "the frozen replica out of the root's rotation", timeout=10, period=0.05)
            detect_s = time.monotonic() - frozen_at
            time.sleep(max(0.0, 6.0 - detect_s))
        finally:
            for p in procs:
                os.kill(p.pid, signal.SIGCONT)
        thawed_at = time.monotonic()
        until(lambda: not out_of_rotation(), "the thawed replica back in rotation", timeout=10, period=0.05)
        time.sleep(2.0)
    failed = [s for s in sent if s[2] != 200]
    during = [s for s in sent if frozen_at <= s[0] < thawed_at]
    hung = [s for s in during if s[1] > 2.0]  # a 20-token answer takes ~0.2 s
    late = [s for s in hung if s[0] > frozen_at + detect_s + 0.5]
    print(f"frozen {frozen}: detect {detect_s:.2f} s; {len(sent)} sent, {len(failed)} failed, {len(during)} during the freeze, "
          f"{len(hung)} of them over 2 s (longest {max((s[1] for s in during), default=0):.2f} s), {len(late)} sent after detection; "
          f"the live leaf Envoy's check answer: max {max(check_s) * 1e3:.1f} ms over {len(check_s)}")
    assert len(during) >= 50, "too little traffic during the freeze to mean anything"
    assert detect_s <= 4.0, f"the frozen replica left the rotation only after {detect_s:.2f} s"
    assert late == [], f"{len(late)} requests sent after the detection still waited on the frozen replica: {late[:5]}"
    assert failed == [], f"{len(failed)} of {len(sent)} failed: {failed[:5]}"
    assert live_out == [], (f"the live replica left the root's rotation {len(live_out)} times "
                            f"(its slowest check answer {max(check_s):.3f} s, timeout 1 s)")
    # A frozen agent's probes time out: it leaves the aggregate, not the cell, which the root never lost.
    assert usable and all(u == 1.0 for u in usable), f"cell a not usable at some point: {usable}"
    if "agent" in frozen:
        assert _counter(plane.root_metrics(), "dlb_root_probe_errors", cell="a") >= 1
