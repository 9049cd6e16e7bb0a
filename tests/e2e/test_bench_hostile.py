"""``dlb bench hostile`` at smoke size: every attack runs against live services and leaves a full record.

The targets themselves are not asserted here (the fixes for the rows land separately and the numbers
depend on the machine); what is checked is that the harness attacks, measures, judges and cleans up:
each record has the issue's fields, the run records its commit, and nothing it started is left running.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from dlb.bench import hostile
from dlb.bench.hostile_attacks import Scale

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(240)]

FIELDS = {"attack", "rss_before_mb", "rss_peak_mb", "rss_after_mb", "loop_block_max_ms", "real_traffic_p50_ms", "real_traffic_errors"}


def test_every_attack_is_replayed_measured_and_judged() -> None:
    tiny = replace(Scale.named("ci"), hpack_blocks=4, open_streams=300, idle_connections=100, als_starts=5_000, als_errors=50,
                   ads_streams=2, ads_node_id_bytes=64 << 10, bogus_types=50, bomb_depth=5, hold_s=0.5)
    children_before = _children()
    result = hostile.run_bench(list(hostile.ATTACKS), hostile.HostileOptions(tiny, rate=5.0, settle_s=0.5, baseline_s=1.0,
                                                                             mem_cap_mb=1000, validate_timeout_s=20.0, warmup_s=1.0))
    assert result["commit"] and result["baseline_p50_ms"] and result["baseline_p50_ms"] > 0
    assert result["baseline_loop_block_max_ms"] is not None and result["load_avg_1m"]["start"] >= 0
    assert result["baseline_loop_lag_max_ms"] is not None  # the root's own heartbeat, read from its /metrics
    assert [r["attack"] for r in result["attacks"]] == list(hostile.ATTACKS)
    for r in result["attacks"]:
        assert set(r) >= FIELDS, r
        assert r["verdicts"] and all(v in (True, False) for v in r["verdicts"].values()), r
        if r["attack"] == "als-path-squat":  # the agent restarts: no one process's RSS or loop spans the row
            continue
        assert r["rss_peak_mb"] and r["rss_peak_mb"] > 0, r
        if r["attack"] != "yaml-bomb-validate":
            assert r["rss_before_mb"] > 0 and r["loop_block_max_ms"] is not None, r
            assert r["loop_lag_max_ms"] is not None and r["detail"]["loop_lag"]["beats"] > 0, r  # the attacked service's own loop
    by = {r["attack"]: r for r in result["attacks"]}
    assert by["slot-squat"]["verdicts"]["new_channels_served_in_1s"] is not None
    assert by["als-injection"]["detail"]["leaf_rif_after"] < 100  # what the stream reported ended with it
    assert by["als-path-squat"]["detail"]["als_entries_after_restart"] > 0
    assert by["stream-walk"]["detail"]["streams_opened"] > 0
    assert by["als-flood"]["detail"]["entries"] == 5_050
    assert by["yaml-bomb-validate"]["detail"]["exit_code"] not in (None, 0)  # the bomb is never a valid config
    assert "config_reported_in_2s_200mb" in by["yaml-bomb-sighup"]["verdicts"]
    assert _children() <= children_before  # control plane, services, Envoys and validators all gone


def _children() -> set[int]:
    me = str(os.getpid())
    out = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    if fh.read().rsplit(")", 1)[1].split()[1] == me:
                        out.add(int(pid))
            except OSError:
                continue
    return out


def test_with_mtls_the_unauthenticated_floods_are_refused() -> None:
    """``--tls``: the access-log flood (row 5) and the ADS bloat (row 6) come from a client without a
    certificate, so they never reach the leaf's in-flight table or the control plane's node state; the
    stalled ClientHellos (row 3's next step, only with --tls) leave the real traffic alone."""
    tiny = replace(Scale.named("ci"), als_starts=5_000, als_errors=50, ads_streams=2, ads_node_id_bytes=64 << 10, bogus_types=50,
                   tls_hellos=200, hold_s=0.5)
    opts = hostile.HostileOptions(tiny, rate=5.0, settle_s=0.5, baseline_s=1.0, mem_cap_mb=1000, validate_timeout_s=20.0, tls=True,
                                  warmup_s=1.0)
    result = hostile.run_bench(["als-flood", "ads-bloat", "stalled-tls-handshakes"], opts)
    assert result["tls"] is True
    als, ads, hellos = result["attacks"]
    assert hellos["detail"]["connections"] == 200 and hellos["real_traffic_errors"] == 0
    assert hostile.default_attacks(True).index("stalled-tls-handshakes") == hostile.default_attacks(True).index("idle-connections") + 1
    assert "stalled-tls-handshakes" not in hostile.default_attacks(False)
    assert als["detail"]["outcome"] == "refused: UNAVAILABLE"
    assert als["detail"]["leaf_rif_after"] < 100  # the fake starts never counted (the bench's own probe got through mTLS)
    assert set(ads["detail"]["outcomes"]) == {"UNAVAILABLE"}
    assert als["real_traffic_errors"] == 0 and ads["real_traffic_errors"] == 0
