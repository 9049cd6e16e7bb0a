"""Reading the leaf Envoy's verdict on its servers from admin ``/clusters?format=json`` (Envoy 1.40's shape)."""

import json

import pytest

from dlb.envoy.host_health import hosts_out


def _host(ip: str, port: int, **health: object) -> dict:
    return {"address": {"socket_address": {"address": ip, "port_value": port}},
            "health_status": {"eds_health_status": "HEALTHY", **health}}


def _clusters(*hosts: dict, name: str = "servers") -> str:
    return json.dumps({"cluster_statuses": [{"name": "picked_server", "host_statuses": []},
                                            {"name": name, "host_statuses": list(hosts)}]})


def test_failed_health_check_and_outlier_ejection_are_out_healthy_hosts_are_not() -> None:
    text = _clusters(_host("10.0.0.1", 80), _host("10.0.0.2", 80, failed_active_health_check=True),
                     _host("10.0.0.3", 80, failed_outlier_check=True), _host("::1", 81, eds_health_status="DRAINING"))
    every, out = hosts_out(text, "servers")
    assert every == {"10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "[::1]:81"}
    assert out == {"10.0.0.2:80", "10.0.0.3:80", "[::1]:81"}


@pytest.mark.parametrize("text", ["<html>not admin</html>", _clusters(name="other")])
def test_a_wrong_admin_address_is_an_error_not_every_server_healthy(text: str) -> None:
    with pytest.raises(ValueError, match="Envoy admin /clusters"):
        hosts_out(text, "servers")


def test_requests_by_host_sums_rq_total_over_the_clusters_that_hold_the_host() -> None:
    """Admin's JSON leaves a zero counter's value out and writes uint64 as a string."""
    from dlb.envoy.host_health import requests_by_host

    def stats(rq: int | None, cx: int = 7) -> list[dict]:
        rq_stat = {"name": "rq_total", "type": "COUNTER"} | ({"value": str(rq)} if rq is not None else {})
        return [{"name": "cx_total", "value": str(cx)}, rq_stat, {"name": "rq_active", "type": "GAUGE", "value": "2"}]

    a = _host("10.0.0.1", 80) | {"stats": stats(5)}
    b = _host("10.0.0.2", 80) | {"stats": stats(None)}
    pool_a = _host("10.0.0.1", 80) | {"stats": stats(3)}
    text = json.dumps({"cluster_statuses": [{"name": "cell-a", "host_statuses": [a]}, {"name": "cell-b", "host_statuses": [b]},
                                            {"name": "pool", "host_statuses": [pool_a]}]})
    assert requests_by_host(text) == {"10.0.0.1:80": 8, "10.0.0.2:80": 0}
    with pytest.raises(ValueError, match="not JSON"):
        requests_by_host("<html>")
