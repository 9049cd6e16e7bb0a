"""One ``is_ip`` for the config, discovery and the Envoy renderer: the cases where the three old copies differed."""

from __future__ import annotations

import pytest

from dlb.config import is_ip
from dlb.config.hostport import parse_hostport


@pytest.mark.parametrize("host", ["10.0.0.1", "0.0.0.0", "::", "::1", "fe80::1", "[::1]", "[2001:db8::5]"])
def test_ip_literals_are_ips(host: str) -> None:
    assert is_ip(host)


@pytest.mark.parametrize("host", [
    "leaf.example", "localhost", "",
    "[10.0.0.1]",  # brackets are IPv6's only (the loader's copy stripped them from anything)
    "[::1", "::1]", "10.0.0.1]",  # half a bracket pair is a typo, not an address
    "999.1.1.1", "10.0.0", "01.2.3.4",
])
def test_names_and_malformed_literals_are_not(host: str) -> None:
    assert not is_ip(host)


def test_bootstrap_and_discovery_use_the_same_function() -> None:
    import dlb.envoy.ads_bootstrap as ads
    from dlb.config import discovery
    from dlb.envoy import bootstrap

    assert discovery.is_ip is is_ip and bootstrap.is_ip is is_ip and ads.is_ip is is_ip


def test_hostport_keeps_ipv6_unbracketed() -> None:
    hp = parse_hostport("[::1]:80")
    assert hp is not None and hp.host == "::1" and is_ip(hp.host)
    assert parse_hostport("[10.0.0.1]:80") is None
