"""DLB config: the example loads, defaults apply, every problem is reported with file, line and path."""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlb.cli import main
from dlb.config import ConfigError, Cost, HostPort, Mechanism, config_from_dict, load_config, parse_config, parse_hostport
from dlb.core.router import PolicyConfig
from dlb.core.topology import Topology

EXAMPLE = Path(__file__).resolve().parents[2] / "envoy_configs" / "dlb.example.yaml"


def minimal(**extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "version": 1,
        "cells": [
            {"name": "a", "leaf": {"address": "127.0.0.1:10010", "probe": "127.0.0.1:9010"}, "servers": ["127.0.0.1:8010"]},
            {"name": "b", "leaf": {"address": "127.0.0.1:10020", "probe": "127.0.0.1:9020"}, "servers": ["127.0.0.1:8020", "127.0.0.1:8021"]},
        ],
        "network": {"one_way_ms": {"a": {"b": 10}}},
        "endpoints": [{"name": "m", "match": {"prefix": "/v1/"}}],
    }
    data.update(extra)
    return data


def problems_of(text: str) -> list[tuple[str, str, int | None]]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "t.yaml")
    assert all(p.file == "t.yaml" for p in info.value.problems)
    return [(p.path, p.reason, p.line) for p in info.value.problems]


# --------------------------------------------------------------------------------------------
# valid configs
# --------------------------------------------------------------------------------------------


def test_example_loads_and_gives_topology() -> None:
    cfg = load_config(EXAMPLE)
    assert cfg.cell_names == ("us-east1", "us-west1", "eu-west1")
    assert [c.index for c in cfg.cells] == [0, 1, 2]
    assert cfg.cells[0].replicas == 3 and cfg.cells[1].replicas == 2  # default = #servers; explicit
    assert cfg.cells[0].cluster_name == "cell-us-east1"
    topo = cfg.topology()
    assert isinstance(topo, Topology)
    assert topo.names == cfg.cell_names
    np.testing.assert_allclose(topo.replicas, [3, 2, 2])
    np.testing.assert_allclose(topo.tau, [[0, 0.031, 0.038], [0.031, 0, 0.066], [0.038, 0.066, 0]])
    assert topo.allowed.tolist() == [[True, True, True], [True, True, True], [False, False, True]]
    assert cfg.rtt_ms("us-west1", "eu-west1") == 132
    assert cfg.endpoint_for_path("/v1/chat/completions").name == "llama-8b"
    assert cfg.endpoint_for_path("/v1/embeddings").name == "embed"
    assert cfg.endpoint_for_path("/healthz") is None


def test_defaults() -> None:
    cfg = config_from_dict(minimal())
    e = cfg.endpoints[0]
    assert e.policy.mechanism is Mechanism.DISCRETE and e.policy.cost is Cost.LATENCY
    assert e.policy.aversion.enabled and not e.policy.affinity.enabled
    assert (e.timeout_s, e.idle_timeout_s) == (600.0, 300.0)
    assert cfg.cells[1].replicas == 2 and cfg.cells[1].servers[0].weight == 1
    assert cfg.network.one_way_ms == ((0.0, 10.0), (10.0, 0.0))  # symmetric fill, zero diagonal
    assert cfg.services.root.ext_proc == HostPort("127.0.0.1", 18080)
    assert cfg.probe.period_ms == 20.0


def test_config_is_frozen() -> None:
    cfg = config_from_dict(minimal())
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.cells[0].replicas = 5  # type: ignore[misc]


def test_policy_converts_to_routing_core_objects() -> None:
    cfg = load_config(EXAMPLE)
    chat, embed = cfg.endpoints
    pc = chat.policy.to_core(cfg.probe)
    assert isinstance(pc, PolicyConfig) and pc.name == "Disc-Lat"
    assert pc.affinity.enabled and math.isclose(pc.affinity.prefix_savings, 0.05)
    assert math.isclose(pc.stale_after_s, 1.0)
    pe = embed.policy.to_core(cfg.probe)
    assert pe.name == "Flow-Grad" and math.isclose(pe.flow.period_s, 0.2)
    prior = chat.latency_prior.to_core()
    assert prior.is_stable_shape() and prior.a == 0.8


def test_asymmetric_and_default_latency() -> None:
    data = minimal(network={"symmetric": False, "default_one_way_ms": 50, "one_way_ms": {"a": {"b": 10}}})
    assert config_from_dict(data).network.one_way_ms == ((0.0, 10.0), (50.0, 0.0))


def test_allowed_restricts_arcs() -> None:
    data = minimal()
    data["network"]["allowed"] = {"b": ["b"]}
    cfg = config_from_dict(data)
    assert cfg.network.allowed == ((True, True), (False, True))
    assert [c.name for c in cfg.allowed_destinations("b")] == ["b"]


# --------------------------------------------------------------------------------------------
# problems: all of them, with paths and lines
# --------------------------------------------------------------------------------------------

BAD = """\
version: 2
cells:
  - name: us-east1
    leaf: {address: 127.0.0.1:10010, probe: localhost}
    servers: [127.0.0.1:8010]
  - name: Bad_Name
    replicas: 0
    leaf: {address: 127.0.0.1:10010, prob: 127.0.0.1:9}
    servers: []
network:
  one_way_ms:
    us-east1: {nowhere: 3}
endpoints:
  - name: a
    match: {prefix: /v1/}
    policy: {mechanism: flows, flow: {kappa: 2}, aversion: {max: 1}}
    latency_prior: {a_s: 1, b_s: 0.5, c: 8}
  - name: a
    match: {prefix: /v1/chat}
    timeout_s: -1
probe: {period_ms: 20, stale_after_ms: 10}
services: {root: {ext_proc: ":80"}}
extra: 1
"""


def test_every_problem_is_reported_with_path_and_line() -> None:
    found = problems_of(BAD)
    expected = [
        ("version", "unsupported version 2", 1),
        ("cells[0].leaf.probe", "'localhost' is not host:port", 4),
        ("cells[1].name", "'Bad_Name' is not a cell name", 6),
        ("cells[1].replicas", "must be >= 1, got 0", 7),
        ("cells[1].leaf.prob", "unknown key (did you mean 'probe'?)", 8),
        ("cells[1].leaf.probe", "required", 8),
        ("cells[1].leaf.address", "also used by cells[0].leaf.address", 8),
        ("cells[1].servers", "must not be empty", 9),
        ("network.one_way_ms.us-east1.nowhere", "not a cell", 12),
        ("endpoints[0].policy.mechanism", "'flows' is not one of: discrete, flow", 16),
        ("endpoints[0].policy.flow.kappa", "must be < 1.5708", 16),
        ("endpoints[0].policy.aversion.max", "must be < 1", 16),
        ("endpoints[0].latency_prior.c", "must be below a_s/b_s=2", 17),
        ("endpoints[1].name", "duplicate endpoint name 'a'", 18),
        ("endpoints[1].match.prefix", "never matches", 19),
        ("endpoints[1].timeout_s", "must be >= 0, got -1", 20),
        ("probe.stale_after_ms", "must exceed probe.period_ms", 21),
        ("services.root.ext_proc", "':80' is not host:port", 22),
        ("extra", "unknown key", 23),
    ]
    for path, reason, line in expected:
        assert any(p == path and reason in r and ln == line for p, r, ln in found), (path, reason, line, found)
    assert len(found) == len(expected), found
    assert [ln for _, _, ln in found] == sorted(ln for _, _, ln in found)  # reported in file order


def test_a_port_out_of_range_is_named_as_such() -> None:
    """``127.0.0.1:70000`` was "not host:port ... quote it in YAML", which sent one looking for a quoting
    slip; only the port is wrong, so the message says that. A bad host keeps the general message."""
    data = minimal(services={"control_plane": {"xds": "127.0.0.1:70000", "status": "[::1]:0"}, "root": {"ext_proc": "local host:80"}})
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    reasons = {p.path: p.reason for p in info.value.problems}
    assert reasons["services.control_plane.xds"] == "'127.0.0.1:70000': port 70000 is not in 1..65535"
    assert reasons["services.control_plane.status"] == "'[::1]:0': port 0 is not in 1..65535"
    assert "'local host:80' is not host:port" in reasons["services.root.ext_proc"]


def test_error_message_format() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(BAD, "dlb.yaml")
    text = str(info.value)
    assert text.startswith("19 problems in config:")
    assert "dlb.yaml:4: cells[0].leaf.probe: 'localhost' is not host:port" in text


def test_missing_pairs_named_once_when_symmetric() -> None:
    data = minimal(network={})
    data["cells"].append({"name": "c", "leaf": {"address": "127.0.0.1:10030", "probe": "127.0.0.1:9030"}, "servers": ["127.0.0.1:8030"]})
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, "x.yaml")
    (p,) = info.value.problems
    assert p.path == "network.one_way_ms" and "a <-> b, a <-> c, b <-> c" in p.reason and "default_one_way_ms" in p.reason


def test_symmetric_conflict() -> None:
    data = minimal(network={"one_way_ms": {"a": {"b": 10}, "b": {"a": 12}}})
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    assert [p.path for p in info.value.problems] == ["network.one_way_ms.a.b"]
    assert "differs from network.one_way_ms.b.a = 12" in info.value.problems[0].reason


def test_latency_unit_slip_is_caught() -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(minimal(network={"one_way_ms": {"a": {"b": 3_600_000}}}))
    assert [str(p) for p in info.value.problems] == ["<dict>: network.one_way_ms.a.b: must be <= 60000, got 3600000"]


def test_null_latency_is_an_error_not_zero() -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(minimal(network={"one_way_ms": {"a": {"b": None}}}))
    assert [p.path for p in info.value.problems] == ["network.one_way_ms.a.b"]


def test_allowed_errors() -> None:
    data = minimal()
    data["network"]["allowed"] = {"a": ["a", "a", "zz"], "b": [], "q": ["a"]}
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    got = {(p.path, p.reason.split(" (")[0]) for p in info.value.problems}
    assert ("network.allowed.a[1]", "'a' listed twice") in got
    assert ("network.allowed.a[2]", "'zz' is not a cell") in got
    assert ("network.allowed.b", "must not be empty") in got
    assert any(path == "network.allowed.q" for path, _ in got)


def test_yaml_syntax_error_has_line() -> None:
    (found,) = problems_of("version: 1\ncells: [\n  {name: a\n")
    assert found[0] == "" and "not valid YAML" in found[1] and found[2] is not None


def test_duplicate_yaml_key() -> None:
    text = yaml.safe_dump(minimal(), sort_keys=False) + "version: 1\n"
    found = problems_of(text)
    assert [(p, "duplicate key" in r) for p, r, _ in found] == [("version", True)]


_ALIASED = """version: 1
cells:
  - name: a
    leaf: &leaf {address: 127.0.0.1:10010, probe: 127.0.0.1:9010}
    servers: [127.0.0.1:8010]
  - name: b
    leaf: *leaf
    servers: [127.0.0.1:8020]
network: {default_one_way_ms: 10}
endpoints:
  - {name: x, match: {prefix: /v1/}, policy: &pol {mechanism: discrete}}
"""


def test_a_problem_inside_an_alias_is_reported_where_the_alias_is_used() -> None:
    """``*leaf`` in cells[1] clashes with cells[0]: the problem is on cells[1]'s line (7), not the anchor's (4),
    which is cells[0]'s and sent the reader to the one cell that is fine; also through a merge key."""
    found = problems_of(_ALIASED)
    assert ("cells[1].leaf.address", 7) in [(p, line) for p, _, line in found], found
    merged = problems_of(_ALIASED.replace("leaf: *leaf", "leaf: {<<: *leaf, adress: 127.0.0.1:10020}"))
    assert ("cells[1].leaf.probe", 7) in [(p, line) for p, _, line in merged], merged
    assert ("cells[1].leaf.adress", 7) in [(p, line) for p, _, line in merged], merged
    typo = problems_of(_ALIASED.replace("policy: &pol {mechanism: discrete}}", "policy: &pol {mechanism: discrete}}\n"
                                        "  - {name: y, match: {prefix: /v2/}, policy: {<<: *pol, cots: rif}}"))
    assert ("endpoints[1].policy.cots", 12) in [(p, line) for p, _, line in typo], typo


def test_empty_and_non_mapping_documents() -> None:
    assert "empty file" in problems_of("")[0][1]
    assert "must be a mapping" in problems_of("- 1\n- 2\n")[0][1]


def test_rif_with_prefix_savings_is_a_time() -> None:
    """Affinity compares expected latencies whatever the routing cost, so savings apply with rif too."""
    data = minimal()
    data["endpoints"][0]["policy"] = {"cost": "rif", "affinity": {"enabled": True, "prefix_savings_ms": 5}}
    cfg = config_from_dict(data)
    assert math.isclose(cfg.endpoints[0].policy.to_core(cfg.probe).affinity.prefix_savings, 0.005)


def test_internal_affinity_header_rejected() -> None:
    data = minimal()
    data["endpoints"][0]["policy"] = {"affinity": {"header": "x-dlb-cell"}}
    with pytest.raises(ConfigError, match="internal"):
        config_from_dict(data)


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.yaml")
    assert info.value.problems[0].file.endswith("nope.yaml") and "cannot read" in info.value.problems[0].reason


@pytest.mark.parametrize(
    "text,expected",
    [
        ("127.0.0.1:80", HostPort("127.0.0.1", 80)),
        ("[::1]:8080", HostPort("::1", 8080)),
        ("leaf-1.example.com:10000", HostPort("leaf-1.example.com", 10000)),
        ("localhost", None),
        (":80", None),
        ("127.0.0.1:0", None),
        ("127.0.0.1:70000", None),
        ("::1:80", None),
        ("[leaf]:80", None),
        ("bad_host:80", None),
        ("999.1.1.1:80", None),
        ("10.0.0:80", None),
        (8080, None),
    ],
)
def test_parse_hostport(text: Any, expected: HostPort | None) -> None:
    assert parse_hostport(text) == expected


def test_hostport_str_round_trips() -> None:
    for s in ("127.0.0.1:80", "[::1]:8080", "leaf.example:1"):
        assert str(parse_hostport(s)) == s


# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------


def test_cli_validate_ok(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "validate", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "valid (version 1): 3 cells, 7/9 arcs allowed, 2 endpoints" in out


def test_cli_validate_summary_names_a_native_discrete_endpoint_and_its_pick(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The summary is how a person checks what the file asks for: it showed a native-discrete endpoint
    as 'discrete-latency', the ext_proc's mechanism, and hid its pick."""
    text = EXAMPLE.read_text().replace("""    policy:
      mechanism: flow
      cost: gradient
      flow: {period_ms: 200, kappa: 0.5}""", """    policy:
      plugins:
        - {type: native-discrete, parameters: {cost: latency, pick: round-robin}}""")
    path = tmp_path / "nd.yaml"
    path.write_text(text)
    assert main(["config", "validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "endpoint embed: prefix /v1/, native-discrete-latency (pick round-robin)" in out, out
    assert "endpoint llama-8b: prefix /v1/chat/, discrete-latency" in out, out
    assert "cell eu-west1: 2 servers, replicas 2" in out and "may send to eu-west1" in out


def test_cli_validate_reports_all_and_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    assert main(["config", "validate", str(bad), str(EXAMPLE), "-q"]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 20 and lines[-1] == f"{bad}: invalid: 19 problems"
    assert f"{bad}:8: cells[1].leaf.prob: unknown key (did you mean 'probe'?)" in lines
    assert captured.out == ""  # the valid file is quiet under -q


# --------------------------------------------------------------------------------------------
# robustness: whatever the input, only ConfigError comes out
# --------------------------------------------------------------------------------------------

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 70000), st.floats(allow_nan=True, allow_infinity=True),
                     st.text(max_size=12), st.sampled_from(["127.0.0.1:1", "a", "flow", "/v1/", "us-east1"]))
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=8)


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, prefix + (i,))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_configs_never_crash(data: st.DataObject) -> None:
    base = yaml.safe_load(EXAMPLE.read_text())
    doc = copy.deepcopy(base)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(_paths(doc)[1:]))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = data.draw(_values)
    try:
        cfg = config_from_dict(doc, "fuzz")
    except ConfigError as exc:
        assert exc.problems and all(p.reason for p in exc.problems)
    else:
        cfg.topology()  # a config that passes is one the routing core accepts


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("abc:-[]{}!&*|>'\"#%@`,?\n \t0123456789./")), max_size=80))
def test_arbitrary_text_only_raises_config_error(text: str) -> None:
    try:
        parse_config(text, "fuzz.yaml")
    except ConfigError as exc:
        assert exc.problems and all(p.file == "fuzz.yaml" for p in exc.problems)


def test_yaml_tags_are_not_constructed() -> None:
    found = problems_of("version: !!python/object:os.system 1\ncells: []\nendpoints: []\n")
    assert any(p == "version" and "bad value" in r for p, r, _ in found), found


def test_json_written_config_with_exponent_floats_loads_as_numbers() -> None:
    """The testbeds write configs with json.dumps (JSON is YAML), which spells 0.00004 as '4e-05'; PyYAML
    (YAML 1.1) reads that as a string, so `latency_prior.b_s` was refused as "must be a number". A plain
    scalar of that shape is a number; a quoted one stays a string."""
    import json

    data = minimal()
    data["endpoints"][0]["latency_prior"] = {"a_s": 0.5, "b_s": 0.00004, "c": 8}
    text = json.dumps(data)
    assert "4e-05" in text
    cfg = parse_config(text, "t.json")
    assert cfg.endpoints[0].latency_prior.b_s == pytest.approx(4e-05)
    quoted = text.replace("4e-05", '"4e-05"')
    assert any(path.endswith("b_s") for path, _, _ in problems_of(quoted.replace("t.json", "t.yaml")))


@pytest.mark.parametrize(("field", "value", "reason"), [
    ("timeout_s", 1e23, "must be <= 3.15576e+11"),  # past Envoy's Duration: the control plane crashed rendering it
    ("idle_timeout_s", 4e-7, "must be 0 (no limit) or at least 0.001 s"),  # rendered "0s": no limit at all
    ("timeout_s", 0.0005, "must be 0 (no limit) or at least 0.001 s"),
])
def test_an_endpoint_timeout_envoy_cannot_hold_or_would_round_to_none_is_named(field: str, value: float, reason: str) -> None:
    data = minimal(endpoints=[{"name": "m", "match": {"prefix": "/v1/"}, field: value}])
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, "x.yaml")
    (p,) = info.value.problems
    assert p.path == f"endpoints[0].{field}" and reason in p.reason, p
    ok = config_from_dict(minimal(endpoints=[{"name": "m", "match": {"prefix": "/v1/"}, "timeout_s": 0, "idle_timeout_s": 0.001}]))
    assert (ok.endpoints[0].timeout_s, ok.endpoints[0].idle_timeout_s) == (0.0, 0.001)


def test_affinity_ttl_is_bounded_like_a_duration() -> None:
    pol = {"affinity": {"enabled": True, "ttl_s": 1e23}}
    with pytest.raises(ConfigError) as info:
        config_from_dict(minimal(endpoints=[{"name": "m", "match": {"prefix": "/v1/"}, "policy": pol}]))
    assert any(p.path.endswith("affinity.ttl_s") and "must be <=" in p.reason for p in info.value.problems), info.value.problems


@pytest.mark.parametrize("given", [True, False])
def test_a_cell_listener_on_the_control_planes_address_is_named(given: bool) -> None:
    """A root at the control plane's xDS address passed validation, and ``dlb up`` called it ready: its
    Envoy NACKed the listener, and the readiness connect reached the xDS server."""
    data = minimal(**({"services": {"control_plane": {"xds": "127.0.0.1:18500"}}} if given else {}))
    xds = "127.0.0.1:18500" if given else "127.0.0.1:18000"
    data["cells"][1]["root"] = {"address": xds}
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, "x.yaml")
    (p,) = info.value.problems
    assert p.path == "cells[1].root.address"
    assert p.reason == f"address {xds} is also used by services.control_plane.xds" + ("" if given else " (its default)")


def test_a_key_that_looks_like_the_end_of_an_index_is_reported_not_a_crash() -> None:
    """The mutation fuzzer's find: ``network: {"]": null}`` raised ValueError looking for the line."""
    with pytest.raises(ConfigError) as info:
        config_from_dict(minimal(network={"one_way_ms": {"a": {"b": 10}}, "]": None}), "x.yaml")
    assert any(p.path == "network.]" and "unknown key" in p.reason for p in info.value.problems), info.value.problems


def test_envoys_rejection_is_cut_to_its_reason_not_the_whole_bootstrap() -> None:
    """Envoy's parse error carries the rendered bootstrap on the same line (67 KB was printed)."""
    from dlb.config.cli import MAX_ENVOY_DETAIL, _clip

    line = "Unable to parse JSON as proto (route.timeout: bad seconds): " + "{" * 70_000
    out = _clip(line)
    assert out.startswith("Unable to parse JSON as proto (route.timeout: bad seconds)") and len(out) < MAX_ENVOY_DETAIL + 60
    assert _clip("short") == "short"


def test_a_snapshot_elsewhere_reads_relative_paths_from_the_operators_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``dlb up`` starts its children from a copy of the accepted config in its run folder; the copy's
    relative ``root_token_file`` must still be the one beside the operator's file (DLB_CONFIG_DIR)."""

    from dlb.config import load_config
    from dlb.config.checker import CONFIG_DIR_ENV

    mine, run = tmp_path / "etc", tmp_path / "run"
    mine.mkdir()
    run.mkdir()
    (mine / "token").write_text("t" * 32)
    (run / "config.yaml").write_text(yaml.safe_dump(minimal(root_token_file="token")))
    with pytest.raises(ConfigError, match="root_token_file"):
        load_config(run / "config.yaml")  # from the copy's own folder: no token there
    monkeypatch.setenv(CONFIG_DIR_ENV, str(mine))
    assert load_config(run / "config.yaml").root_token_file == str(mine / "token")


def test_a_later_endpoints_own_prior_is_warned_about_not_silently_ignored() -> None:
    """A cell's model starts from the first endpoint's prior; a stranger's slower-region prior on a second
    endpoint did nothing. Said when a later endpoint sets one that differs; quiet when it sets none or the same."""
    from dlb.config.priors import unused_prior_warning

    two = [{"name": "m", "match": {"prefix": "/v1/chat/"}}, {"name": "r", "match": {"prefix": "/v1/"}}]
    assert unused_prior_warning(config_from_dict(minimal(endpoints=two))) is None
    slow_b = {"b": {"a_s": 2.0}}
    later = [two[0], {**two[1], "latency_prior_by_cell": slow_b}]
    warning = unused_prior_warning(config_from_dict(minimal(endpoints=later)))
    assert warning is not None and "endpoint(s) r:" in warning and "first endpoint's (m)" in warning, warning
    same = [{**two[0], "latency_prior_by_cell": slow_b}, {**two[1], "latency_prior_by_cell": slow_b}]
    assert unused_prior_warning(config_from_dict(minimal(endpoints=same))) is None
    first_only = [{**two[0], "latency_prior": {"a_s": 0.5, "b_s": 0.02}}, two[1]]
    assert unused_prior_warning(config_from_dict(minimal(endpoints=first_only))) is None
