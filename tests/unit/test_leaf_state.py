"""The leaf's bookkeeping (pure, clock passed in): picking, RIF accounting, completions, health."""

import numpy as np
import pytest

from dlb.core.estimator import EstimatorConfig
from dlb.core.latency_model import LatencyParams
from dlb.ext_proc.leaf_state import UNKNOWN, Completion, LeafState, ServerState

PRIOR = LatencyParams(0.1, 0.01, 4.0, 1.0)


def make(n=3, choices=2, **kw) -> LeafState:
    servers = [ServerState(f"10.0.0.{i}:80", weight=kw.pop(f"w{i}", 1.0)) for i in range(n)]
    return LeafState(cell="c", servers=servers, replicas=n, prior=PRIOR, choices=choices, rng=np.random.default_rng(0),
                     estimator_config=EstimatorConfig(window_s=60, refit_period_s=1), **kw)


def test_least_loaded_when_d_covers_all_servers_and_rif_is_counted_at_pick():
    st = make(3, choices=3)
    picks = [st.pick(0.0, f"r{i}") for i in range(9)]
    # Join-the-shortest-queue with nothing completing: perfectly balanced.
    assert sorted(picks.count(i) for i in range(3)) == [3, 3, 3]
    assert st.rif == 9 and [s.rif for s in st.servers] == [3, 3, 3]
    assert st.inflight["r8"].cell_rif == 9


def test_weights_scale_the_load():
    st = make(2, choices=2, w1=3.0)
    picks = [st.pick(0.0, f"r{i}") for i in range(8)]
    assert picks.count(1) == 6 and picks.count(0) == 2


def test_scraped_load_counts_work_the_leaf_did_not_send():
    st = make(2, choices=2)
    st.on_scrape(0, running=5.0, waiting=3.0)  # busy with someone else's traffic
    st.on_scrape(1, running=0.0, waiting=0.0)
    assert [st.pick(0.0, f"r{i}") for i in range(5)] == [1] * 5


def test_power_of_d_samples_only_d_servers():
    st = make(10, choices=2)
    for s in st.servers[1:]:
        s.rif = 100  # everyone but server 0 is loaded
    picks = [st.choose(0.0) for _ in range(200)]
    # Server 0 wins whenever sampled (P = 2/10 per pick), never always: d < n.
    share = picks.count(0) / len(picks)
    assert 0.08 < share < 0.35


def test_completion_releases_rif_and_feeds_the_model_and_error_rate():
    st = make(2, choices=2)
    st.pick(0.0, "a")
    st.pick(0.0, "b")
    server_a = st.inflight["a"].server
    st.complete(1.0, Completion("a", st.servers[server_a].address, 200, 0.5))
    st.complete(1.0, Completion("b", "", 503, 0.1))
    assert st.rif == 0 and all(s.rif == 0 for s in st.servers)
    assert st.completed == 2 and st.failed == 1
    assert st.errors.rate(1.0) == pytest.approx(0.5)
    assert len(st.estimator) == 1  # only the success is a latency sample


def test_client_abort_is_neither_error_nor_sample():
    st = make(1)
    st.pick(0.0, "a")
    st.complete(0.5, Completion("a", "", 0, 0.2, client_abort=True))
    assert st.rif == 0 and st.completed == 0 and st.errors.rate(0.5) == 0.0


def test_als_start_entries_count_rif_without_a_leaf_pick():
    st = make(2)
    st.start(0.0, "x")  # LEAST_REQUEST mode: Envoy picked, the log tells us it started
    assert st.rif == 1 and st.inflight["x"].server == UNKNOWN
    st.complete(0.3, Completion("x", st.servers[1].address, 200, 0.3))
    assert st.rif == 0 and st.servers[1].completed == 1 and st.servers[1].rif == 0


def test_a_completion_never_seen_starting_is_an_outcome_but_not_a_latency_sample():
    """A restarted agent gets the entries its Envoy kept while it was down (measured: 3.5-s streams
    that had run at RIF ~20, all delivered at once): their RIF at arrival is unknown, so they count
    for errors only; as samples at a guessed RIF of 1 they made the restarted cell's first model 17× slow."""
    st = make(2)
    for i in range(5):
        st.complete(10.0, Completion(f"before-restart-{i}", st.servers[0].address, 200, 3.5))
    st.complete(10.0, Completion("failed-before-restart", st.servers[0].address, 503, 0.1))
    assert st.completed == 6 and st.failed == 1 and st.unmatched == 6
    assert len(st.estimator) == 0
    st.pick(10.0, "seen")
    st.complete(10.2, Completion("seen", st.servers[st.inflight["seen"].server].address, 200, 0.2))
    assert len(st.estimator) == 1


def test_duplicate_start_after_pick_is_not_double_counted():
    st = make(2)
    st.pick(0.0, "x")
    st.start(0.0, "x")
    assert st.rif == 1 and sum(s.rif for s in st.servers) == 1


def test_lost_completions_expire():
    st = make(1, max_age_s=10.0)
    st.pick(0.0, "old")
    st.pick(5.0, "new")
    assert st.expire(12.0) == 1
    assert st.rif == 1 and st.servers[0].rif == 1


def test_failing_server_is_ejected_then_retried():
    st = make(2, choices=2, eject_after=3, eject_s=2.0)
    bad = st.servers[0].address
    for i in range(3):
        st.start(0.0, f"e{i}", 0)
        st.complete(0.0, Completion(f"e{i}", bad, 500, 0.01))
    assert st.usable(1.0) == [1]
    assert all(st.pick(1.0, f"r{i}") == 1 for i in range(5))
    assert 0 in st.usable(2.5)  # ejection ends: the server gets a chance to recover


def test_all_ejected_fails_open():
    st = make(1, eject_after=1)
    st.start(0.0, "e", 0)
    st.complete(0.0, Completion("e", st.servers[0].address, 500, 0.01))
    assert st.usable(0.5) == [0]


def test_unreachable_metrics_mark_server_unhealthy():
    st = make(2, scrape_fail_threshold=2)
    st.on_scrape(0, None, None)
    assert st.healthy(0.0) == 2
    st.on_scrape(0, None, None)
    assert st.healthy(0.0) == 1 and st.usable(0.0) == [1]
    assert st.healthy_replicas(0.0) == 1  # probes report k_j scaled by the healthy fraction
    st.on_scrape(0, 1.0, 0.0)
    assert st.healthy(0.0) == 2


def test_slow_metrics_make_load_unknown_but_keep_the_server_healthy():
    """A scrape that times out is a busy server, not a dead one: no number of them takes it (or,
    with every server slow, the whole cell) out of service; a later good scrape restores its load."""
    st = make(2, scrape_fail_threshold=2)
    st.on_scrape(0, 3.0, 1.0)
    for _ in range(5):
        st.on_scrape_slow(0)
        st.on_scrape_slow(1)
    assert st.healthy(0.0) == 2 and st.usable(0.0) == [0, 1] and st.healthy_replicas(0.0) == 2
    assert st.servers[0].scraped == -1.0  # unknown, not the stale 4
    st.on_scrape(0, 1.0, 0.0)
    assert st.servers[0].scraped == 1.0


def test_model_is_refit_from_completions():
    """Completions tagged with the cell RIF at their arrival recover a known latency curve."""
    from dlb.core.latency_model import latency

    st = make(1)
    rng = np.random.default_rng(1)
    truth = LatencyParams(0.2, 0.02, 6.0, 1.0)
    t = 0.0
    k = 0
    for _ in range(40):
        burst = int(rng.integers(1, 25))
        ids = [f"r{k + j}" for j in range(burst)]
        k += burst
        for rid in ids:
            st.pick(t, rid)
        for rid in ids:
            n = st.inflight[rid].cell_rif
            lat = float(latency(n, truth.a, truth.b, truth.c, truth.s)) * (1 + 0.02 * rng.standard_normal())
            st.complete(t, Completion(rid, st.servers[0].address, 200, lat))
        t += 0.1
    assert st.rif == 0 and len(st.estimator) == k
    st.estimator.refit(t)
    p = st.estimator.params
    assert st.estimator.confidence > 0.5
    assert p.a == pytest.approx(truth.a, rel=0.2) and p.b == pytest.approx(truth.b, rel=0.2)


def test_latency_sample_is_the_servers_share_not_the_leaf_total():
    """The testbed's WAN delay sits in the leaf Envoy before the upstream; the model must not see it."""
    from envoy.data.accesslog.v3 import accesslog_pb2
    from google.protobuf.duration_pb2 import Duration

    from dlb.ext_proc.leaf_als import _serving_seconds

    c = accesslog_pb2.AccessLogCommon(
        time_to_first_upstream_tx_byte=Duration(nanos=50_000_000),  # 50 ms WAN delay first
        time_to_last_upstream_rx_byte=Duration(nanos=250_000_000),
        time_to_last_downstream_tx_byte=Duration(nanos=251_000_000),
    )
    assert _serving_seconds(c) == pytest.approx(0.2)
    only_total = accesslog_pb2.AccessLogCommon(time_to_last_downstream_tx_byte=Duration(nanos=251_000_000))
    assert _serving_seconds(only_total) == pytest.approx(0.251)


@pytest.mark.parametrize(("status", "flags", "details", "abort", "cut", "ended"), [
    (200, {"downstream_connection_termination": True}, "via_upstream", True, False, False),  # a root's timeout mid-stream (HTTP/1.1)
    # the server's answer had ended (its last byte stamped): a client that closed at data: [DONE] is no abort
    (200, {"downstream_connection_termination": True}, "via_upstream", False, False, True),
    (200, {"downstream_remote_reset": True}, "via_upstream", True, False, False),  # an HTTP/2 client's reset mid-stream
    (0, {"downstream_connection_termination": True}, "", True, False, False),  # left before any answer
    (200, {}, "via_upstream", False, False, True),  # a whole answer
    (503, {"downstream_connection_termination": True}, "via_upstream", False, False, False),  # the server's error first
    (200, {"downstream_connection_termination": True, "upstream_connection_termination": True},
     "upstream_reset_after_response_started{connection_termination}", False, True, False),  # the server broke it first
])
def test_an_answer_left_by_its_downstream_is_a_client_abort(status, flags, details, abort, cut, ended):
    """A root resetting a stream at its route timeout after the 200 was forwarded: counted a success with
    a latency sample ending at the reset unless the downstream flags make it a client abort."""
    from envoy.data.accesslog.v3 import accesslog_pb2

    from dlb.ext_proc.leaf_als import _client_abort, _cut_stream

    e = accesslog_pb2.HTTPAccessLogEntry()
    e.response.response_code.value = status
    e.response.response_code_details = details
    for name, v in flags.items():
        setattr(e.common_properties.response_flags, name, v)
    if ended:
        e.common_properties.time_to_last_upstream_rx_byte.nanos = 250_000_000
    assert (_client_abort(e), _cut_stream(e)) == (abort, cut)


def test_a_recovered_server_counts_again_only_after_the_envoy_health_check_could_have_seen_it():
    """Whole-cell fault in `dlb bench faults`: the agent's first good scrape made the cell usable while the
    leaf Envoy still held every server unhealthy, and a request got `503 no_healthy_upstream`."""
    st = make(2, scrape_fail_threshold=2, rejoin_hold_s=0.75)
    for i in (0, 1):
        st.on_scrape(i, None, None, now=10.0)
        st.on_scrape(i, None, None, now=10.2)
    assert st.healthy_replicas(10.2) == 0
    st.on_scrape(0, 0.0, 0.0, now=20.0)
    st.on_scrape(1, 0.0, 0.0, now=20.0)
    assert st.healthy(20.5) == 0  # back, but not yet in Envoy's rotation
    assert st.healthy(20.75) == 2
    st.on_scrape(0, 1.0, 0.0, now=21.0)  # a good scrape of a healthy server starts no hold
    assert st.healthy(21.0) == 2


def test_background_probe_settings_change_live_and_keep_the_schedule() -> None:
    """New ``background-probe`` settings replace the prober's config but keep what it has counted
    (a settings change is not a restart); ``None`` turns probing off."""
    from dlb.core.background import BackgroundProbeConfig, BackgroundProber
    from dlb.ext_proc.leaf_background import LeafBackground

    bg = LeafBackground(make(2))
    first, second = BackgroundProbeConfig(min_interval_s=1.0), BackgroundProbeConfig(min_interval_s=2.0)
    bg.set_background(first, b"{}")
    bg.prober = BackgroundProber(first, sent=5)
    bg.set_background(second, b'{"max_tokens":4}')
    assert bg.prober.config is second and bg.prober.sent == 5 and bg.bg_body == b'{"max_tokens":4}'
    bg.set_background(None, b"")
    assert bg.bg_config is None and bg.prober is None


def test_declared_changes_are_counted_by_source_and_direction_and_exported_from_zero() -> None:
    """Every declared change is logged and counted under its source and direction; the leaf exports all four
    counters from 0, so a rate works from the first change (probes declaring a steady cell "faster" again
    and again is what probes shorter than the traffic look like)."""
    from structlog.testing import capture_logs

    from dlb.ext_proc.leaf import LeafAgent

    agent = LeafAgent(make(2))
    bg = agent.background

    def exported() -> dict[tuple[str, str], float]:
        fam = next(f for f in agent.collect() if f.name == "dlb_leaf_cell_changes")
        return {(s.labels["source"], s.labels["direction"]): s.value for s in fam.samples}

    assert exported() == {(s, d): 0 for s in ("probes", "traffic") for d in ("faster", "slower")}
    with capture_logs() as logs:
        bg.changed("probes", "faster", samples_dropped=40)
        bg.changed("probes", "faster", samples_dropped=35)
        bg.changed("traffic", "slower", since=12.5)
    assert [(e["source"], e["direction"]) for e in logs if e["event"] == "cell_change_detected"] == [
        ("probes", "faster"), ("probes", "faster"), ("traffic", "slower")]
    assert exported()[("probes", "faster")] == 2 and exported()[("traffic", "slower")] == 1
    assert exported()[("probes", "slower")] == 0


def test_a_refused_probe_says_the_servers_reason_and_new_settings_get_their_first_failure_said(monkeypatch) -> None:
    """A probe the servers refuse logs their reason (the body's start) and which plugin settings a 4xx names;
    then every 100th is said, but new settings (a reload) get their first failure said at once: a second
    mistake made after a first went unlogged (stranger 39). A fake connection: unit tests open no sockets."""
    import asyncio

    from structlog.testing import capture_logs

    from dlb.core.background import BackgroundProbeConfig
    from dlb.ext_proc.leaf_background import LeafBackground

    answer = b'HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\n\r\n{"error":{"message":"The model nosuch does not exist."}}'

    class Reader:
        async def read(self, n: int) -> bytes:
            return answer

    class Writer:
        def write(self, data: bytes) -> None:
            pass

        def close(self) -> None:
            pass

    async def fake_open(host: str, port: int):
        return Reader(), Writer()

    monkeypatch.setattr(asyncio, "open_connection", fake_open)
    bg = LeafBackground(make(2))
    bg.set_background(BackgroundProbeConfig(), b"{}")

    def probe() -> list[dict]:
        with capture_logs() as logs:
            asyncio.run(bg._background_probe("127.0.0.1:9", b"{}", "dlb-background-probe-1", 1.0))
        return [e for e in logs if e["event"] == "background_probe_failed"]

    first = probe()
    assert len(first) == 1 and first[0]["status"] == 404 and "does not exist" in first[0]["reason"]
    assert "max_tokens" in first[0]["hint"]
    assert [len(probe()) for _ in range(100)] == [0] * 99 + [1]  # then every 100th
    assert not probe()
    bg.set_background(BackgroundProbeConfig(), b'{"max_tokens":100000}')
    assert len(probe()) == 1 and bg.bg_failed == 103


def test_a_cell_still_completing_its_slow_tail_after_the_roots_left_it_is_probed() -> None:
    """The prober's silence runs from the last request the leaf saw *start*: a cell the roots stopped
    sending to while 20 slow requests were running (the fault bench's overloaded cell completed such a tail
    for 18 s, and its first probe came 15 s after the last of them) is probed one interval after its last
    arrival, completions or not."""
    from dlb.core.background import BackgroundProbeConfig, BackgroundProber
    from dlb.ext_proc.leaf_background import LeafBackground

    st = make(2)
    for k in range(20):
        st.start(0.0, f"r{k}", k % 2)
    bg = LeafBackground(st)
    prober = BackgroundProber(BackgroundProbeConfig(min_interval_s=1.0, max_interval_s=5.0, warmup=0))
    assert not bg.probe_due(prober, 0.0)
    for k in range(20):  # one completion every 0.25 s, none arriving
        t = 0.25 * (k + 1)
        st.complete(t, Completion(f"r{k}", st.servers[k % 2].address, 200, t))
        if t < 5.0:
            assert not bg.probe_due(prober, t), t
    assert bg.probe_due(prober, 5.0)


def test_a_refused_request_is_counted_but_never_a_latency_sample() -> None:
    """A 4xx other than 429 (a bad body, an unknown model, a prompt too long; or the leaf's own probe with a
    wrong model whose tag Envoy replaced) ends in a millisecond without serving anything: it is counted as
    a completion, not an error, and never reaches the latency model. It did, so 20 such answers made an
    idle cell's model ~1000x fast (a stranger's `dlb up` with a probe model the servers rejected)."""
    st = make(2)
    for k in range(20):
        st.start(0.0, f"bad{k}", k % 2)
        st.complete(0.01, Completion(f"bad{k}", st.servers[k % 2].address, 404 if k % 2 else 400, 0.001))
    assert st.completed == 20 and st.failed == 0 and len(st.estimator) == 0 and st.rif == 0
    st.start(0.0, "ok", 0)
    st.complete(0.5, Completion("ok", st.servers[0].address, 200, 0.5))
    st.start(0.0, "full", 1)
    st.complete(0.5, Completion("full", st.servers[1].address, 429, 0.001))
    assert len(st.estimator) == 1 and st.failed == 1  # a 200 is a sample; a 429 is an error, as before


def test_capacity_is_learned_from_each_servers_429s_and_unknown_until_all_refused() -> None:
    """The probe's capacity: what every healthy server held when it refused (429), summed; unknown
    (None) while any healthy server never refused, so a root never sheds on a guess (dlb.core.shedding)."""
    leaf = make(n=2, choices=2)
    for k in range(5):
        leaf.start(0.0, f"a{k}", 0)
    leaf.start(0.0, "r0", 0)
    leaf.complete(0.1, Completion("r0", leaf.servers[0].address, 429, 0.001))
    assert leaf.servers[0].admit_limit == 5 and leaf.capacity(0.1) is None  # server 1 never refused
    leaf.start(0.2, "r1", 1)
    leaf.complete(0.2, Completion("r1", leaf.servers[1].address, 503, 0.001))  # a fault, not a full queue
    assert leaf.capacity(0.2) is None
    for k in range(3):
        leaf.start(0.3, f"b{k}", 1)
    leaf.start(0.3, "r2", 1)
    leaf.complete(0.3, Completion("r2", leaf.servers[1].address, 429, 0.001))
    assert leaf.capacity(0.3) == 8
    leaf.complete(0.4, Completion("a0", leaf.servers[0].address, 200, 1.0))
    leaf.start(0.4, "r3", 0)
    leaf.complete(0.4, Completion("r3", leaf.servers[0].address, 429, 0.001))  # fewer in flight: the most stays
    assert leaf.servers[0].admit_limit == 5
    leaf.servers[1].ejected_until = 10.0
    assert leaf.capacity(1.0) == 5  # an ejected server admits nothing


def test_the_probe_answer_carries_the_capacity_learned_from_the_access_log() -> None:
    """Through the leaf agent: access-log entries of 429s from each server (the pick counted by the leaf's
    ext_proc) make the probe answer report the cell's capacity; before, the field is absent."""
    import asyncio

    from envoy.service.accesslog.v3 import als_pb2

    from dlb.ext_proc.leaf import LeafAgent

    agent = LeafAgent(make(2, choices=2))
    assert not agent.probe.snapshot(0.0).HasField("capacity")  # an unknown capacity is not sent as 0
    st = agent.state
    for i in range(2):
        for k in range(3):
            st.start(0.0, f"s{i}-{k}", i)
        st.start(0.0, f"full{i}", i)
    msg = als_pb2.StreamAccessLogsMessage()
    for i in range(2):
        e = msg.http_logs.log_entry.add()
        e.request.request_id = f"full{i}"
        e.response.response_code.value = 429
        host, port = st.servers[i].address.split(":")
        e.common_properties.upstream_remote_address.socket_address.address = host
        e.common_properties.upstream_remote_address.socket_address.port_value = int(port)

    async def feed() -> None:
        async def one():
            yield msg
        await agent.access_log.consume(one())

    asyncio.run(feed())
    answer = agent.probe.snapshot(0.0)
    assert answer.HasField("capacity") and answer.capacity == 6


def test_servers_the_leaf_envoy_took_out_are_neither_picked_nor_counted_healthy():
    """The agent's healthy servers are its Envoy's: with every server out there, probes report 0 replicas."""
    st = make(3, choices=3)
    st.set_envoy_view({"10.0.0.1:80"})
    assert st.healthy(0.0) == 2 and st.healthy_replicas(0.0) == 2
    assert 1 not in {st.pick(0.0, f"r{i}") for i in range(12)}
    st.set_envoy_view({s.address for s in st.servers})
    assert st.healthy(0.0) == 0 and st.healthy_replicas(0.0) == 0
    st.set_envoy_view(set())  # back in its rotation: back in the agent's
    assert st.healthy(0.0) == 3


def test_requests_in_flight_reach_the_fit_as_lower_bounds():
    """What the leaf hands its refit: each running request's cell RIF at arrival and its age, thinned
    evenly to the estimator's sample bound so a backlog of thousands stays one cheap pass."""
    st = LeafState(cell="c", servers=[ServerState("10.0.0.1:80")], replicas=1, prior=PRIOR, choices=1,
                   rng=np.random.default_rng(0), estimator_config=EstimatorConfig(max_samples=4))
    for i in range(8):
        st.pick(float(i), f"r{i}")
    st.complete(8.0, Completion("r0", "10.0.0.1:80", 200, 8.0))
    running = st.running(10.0)
    assert running.rif.tolist() == [2.0, 4.0, 6.0, 8.0]  # r1, r3, r5, r7: every other of the seven left
    assert running.age.tolist() == [9.0, 7.0, 5.0, 3.0]


def test_the_agents_pick_names_the_server_after_an_endpoint_update() -> None:
    """Through the leaf agent: after xDS replaces the server list (one removed, one added, the order
    changed), every pick reply names a server of the new list, the one the state picked."""
    from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

    from dlb.envoy import contract
    from dlb.ext_proc.leaf import LeafAgent

    agent = LeafAgent(make(2, choices=2))
    agent.state.set_servers([("10.0.0.9:80", 1.0), ("10.0.0.1:80", 1.0), ("10.0.0.8:80", 1.0)])
    new = {s.address for s in agent.state.servers}
    for k in range(12):
        req = ep.ProcessingRequest()
        h = req.request_headers.headers.headers.add()
        h.key, h.raw_value = contract.REQUEST_ID, f"r{k}".encode()
        reply, _ = agent.handle(req.SerializeToString())
        assert isinstance(reply, bytes)
        rec = agent.state.inflight[f"r{k}"]
        named = {m.header.raw_value.decode() for m in
                 ep.ProcessingResponse.FromString(reply).request_headers.response.header_mutation.set_headers
                 if m.header.key == contract.SERVER}
        assert named == {agent.state.servers[rec.server].address} and named <= new
