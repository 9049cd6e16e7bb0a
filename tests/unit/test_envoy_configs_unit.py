"""Real-Envoy tests of the root and leaf bootstraps (templates in envoy_configs/ and rendered ones).

Here: the tests that run in-process (no sockets, no processes);
the others: ``tests/e2e/test_envoy_configs.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from test_envoy_configs import CONFIG_DIR, TEMPLATES, _hcm, three_cell_config

from dlb.envoy.bootstrap import (
    HEADER_SRC_CELL,
    INTERNAL_HEADERS,
    leaf_bootstrap,
    root_bootstrap,
)
from dlb.envoy.root_token import TOKEN_CHECK, TOKEN_FILTER, root_token
from dlb.procutil import free_port

# --------------------------------------------------------------------------------------------
# every YAML validates
# --------------------------------------------------------------------------------------------


def test_templates_exist() -> None:
    assert {p.name for p in TEMPLATES} >= {"root.yaml", "leaf.yaml"}


def test_templates_match_renderer_on_what_matters() -> None:
    """The hand-written root template and the renderer agree on the security and fail-open settings."""
    from dlb.config import load_config

    cfg = load_config(CONFIG_DIR / "dlb.example.yaml")
    rendered = root_bootstrap(cfg, "us-east1", admin_port=9901)
    template = yaml.safe_load((CONFIG_DIR / "root.yaml").read_text())
    t_hcm, r_hcm = _hcm(template), _hcm(rendered)
    assert set(t_hcm["route_config"]["internal_only_headers"]) == set(INTERNAL_HEADERS)
    for key in ("use_remote_address", "xff_num_trusted_hops", "internal_address_config", "max_request_headers_kb",
                "request_timeout", "normalize_path", "merge_slashes", "common_http_protocol_options"):
        assert t_hcm[key] == r_hcm[key], key
    assert t_hcm["route_config"]["request_headers_to_add"] == r_hcm["route_config"]["request_headers_to_add"]
    assert _filter(t_hcm, "envoy.filters.http.ext_proc") == _filter(r_hcm, "envoy.filters.http.ext_proc")
    assert template["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"

    leaf_t = yaml.safe_load((CONFIG_DIR / "leaf.yaml").read_text())
    leaf_r = leaf_bootstrap(cfg, "us-east1", admin_port=9902, emulate_wan=True)
    assert leaf_t["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"
    for name in ("dlb.wan_delay.us-west1", "dlb.wan_delay.eu-west1"):
        assert _filter(_hcm(leaf_t), name)["typed_config"]["headers"] == [{"name": HEADER_SRC_CELL, "string_match": {"exact": name.rsplit(".", 1)[1]}}]
    # The token is in no route and no filter but the leaf's check (and the root's bootstrap secret): what the templates show.
    for name in (TOKEN_CHECK, TOKEN_FILTER):
        t, r = (_filter(_hcm(b), name) for b in ((leaf_t, leaf_r) if name == TOKEN_CHECK else (template, rendered)))
        assert t == r, name
    assert template["static_resources"]["secrets"] == rendered["static_resources"]["secrets"]
    for boot in (template, rendered, leaf_t, leaf_r):
        assert root_token(cfg) not in str(_hcm(boot)["route_config"])
    # Same delay as rendered from the example config (eu-west1 may not send to us-east1 there, so only us-west1).
    assert _filter(_hcm(leaf_t), "dlb.wan_delay.us-west1") == _filter(_hcm(leaf_r), "dlb.wan_delay.us-west1")
    # Same dead-server handling: health check, outlier detection, no panic mode, retry budget and safe retries.
    servers_t, servers_r = (next(c for c in b["static_resources"]["clusters"] if c["name"] == "servers") for b in (leaf_t, leaf_r))
    for key in ("health_checks", "outlier_detection", "common_lb_config"):
        assert yaml.safe_load(yaml.safe_dump(servers_t[key])) == yaml.safe_load(yaml.safe_dump(servers_r[key])), key
    assert servers_t["circuit_breakers"]["thresholds"][0]["retry_budget"] == servers_r["circuit_breakers"]["thresholds"][0]["retry_budget"]
    retry_t, retry_r = (next(r for r in _hcm(b)["route_config"]["virtual_hosts"][0]["routes"] if r["name"] == "least-request")["route"]["retry_policy"]
                        for b in (leaf_t, leaf_r))
    assert retry_t == retry_r
    # Completions reach the agent the same way (without it a copied template's cell RIF only grew).
    assert _hcm(leaf_t)["access_log"] == _hcm(leaf_r)["access_log"]
    agent_t, agent_r = (next(c for c in b["static_resources"]["clusters"] if c["name"] == "dlb_leaf_agent") for b in (leaf_t, leaf_r))
    assert yaml.safe_load(yaml.safe_dump(agent_t)) == yaml.safe_load(yaml.safe_dump(agent_r))


def _filter(hcm: dict[str, Any], name: str) -> dict[str, Any]:
    return next(f for f in hcm["http_filters"] if f["name"] == name)


# --------------------------------------------------------------------------------------------
# root: fail-open by weights, spoofed headers ignored, ext_proc pick honoured
# --------------------------------------------------------------------------------------------


# Controls: these show the protection above is real by removing it (and document Envoy's behaviour).


# --------------------------------------------------------------------------------------------
# leaf: WAN emulation by source cell
# --------------------------------------------------------------------------------------------



def test_the_docs_list_the_headers_the_root_strips() -> None:
    """docs/envoy-configs.md names the root's ``internal_only_headers`` as the renderer sets them (it left
    out ``x-dlb-root-token``)."""
    import re

    doc = (CONFIG_DIR.parent / "docs" / "envoy-configs.md").read_text()
    listed = re.search(r"`internal_only_headers: \[([^\]]*)\]`", doc)
    assert listed is not None
    assert {h.strip() for h in listed.group(1).split(",")} == set(INTERNAL_HEADERS)

def test_leaf_without_emulation_adds_no_fault_filter() -> None:
    cfg = three_cell_config({"a": free_port(), "b": free_port(), "c": free_port()}, one_way_ms=150.0)
    boot = leaf_bootstrap(cfg, "b", admin_port=free_port(), emulate_wan=False)
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert [f["name"] for f in hcm["http_filters"]] == ["envoy.filters.http.health_check", TOKEN_CHECK, "envoy.filters.http.router"]
    boot2 = leaf_bootstrap(cfg, "b", admin_port=free_port(), emulate_wan=True)
    hcm2 = boot2["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    delays = {f["name"]: f["typed_config"]["delay"]["fixed_delay"] for f in hcm2["http_filters"] if "fault" in f["typed_config"]["@type"]}
    assert delays == {"dlb.wan_delay.a": "0.3s", "dlb.wan_delay.c": "0.3s"}


def test_durations_and_tiny_delays() -> None:
    from dlb.envoy.bootstrap import _duration, wan_delays_ms

    assert [_duration(x) for x in (0, 600, 0.062, 1e-7, 0.0000015, 2.5)] == ["0s", "600s", "0.062s", "0s", "0.000002s", "2.5s"]
    cfg = three_cell_config({"a": free_port(), "b": free_port(), "c": free_port()}, one_way_ms=0.0001)
    assert wan_delays_ms(cfg, "a") == {}  # 0.2 µs round trips: no zero-length fault filters


@pytest.mark.parametrize("path", [CONFIG_DIR / "dlb.example.yaml", CONFIG_DIR.parent / "deploy/k8s/config/dlb.yaml"],
                         ids=["example", "k8s"])
def test_shipped_configs_let_a_completions_stream_run_long(path: Path) -> None:
    """``/v1/completions`` streams as long as chat does; a shipped catch-all with a 30-s whole-request
    limit cut every longer completion stream mid-answer (HTTP 200, then a truncated body)."""
    from dlb.config import config_from_dict

    raw = yaml.safe_load(path.read_text())
    raw.pop("root_token_file", None)  # the k8s Secret's mount path, not on this machine
    cfg = config_from_dict(raw)
    ep = next(e for e in cfg.endpoints if "/v1/completions".startswith(e.match.prefix))
    assert ep.timeout_s == 0 or ep.timeout_s >= 300, (ep.name, ep.timeout_s)


def test_the_ready_listener_binds_where_the_traffic_listener_does() -> None:
    """A loopback leaf's /ready and Envoy stats stay on loopback (they were on 0.0.0.0 whatever the config,
    which promises a loopback address is bound as it is); a pod's address binds every interface for the kubelet."""
    from dlb.config import config_from_dict

    def ready_host(address: str) -> str:
        cfg = config_from_dict({"version": 1, "endpoints": [{"name": "m", "match": {"prefix": "/v1/"}}],
                                "cells": [{"name": "a", "servers": ["10.0.0.9:8000"],
                                           "leaf": {"address": address, "probe": "127.0.0.1:9010"}}]})
        boot = leaf_bootstrap(cfg, "a", admin_port=9902, emulate_wan=False, ready_port=9912)
        return next(x for x in boot["static_resources"]["listeners"] if x["name"] == "dlb_ready")["address"]["socket_address"]["address"]

    assert ready_host("127.0.0.1:10010") == "127.0.0.1"
    assert ready_host("10.0.0.5:10010") == "0.0.0.0"
