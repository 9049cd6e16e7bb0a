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
