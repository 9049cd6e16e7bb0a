"""``free_port``: ports for configs that must name an address before the service that binds it runs.

Here: the tests that run in-process (no sockets, no processes);
the others: ``tests/integration/test_procutil.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dlb import procutil
from dlb.procutil import free_port, free_port_block


def _below_range() -> tuple[int, int]:
    try:
        lo, hi = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        pytest.skip("no /proc/sys/net/ipv4/ip_local_port_range")
    span = (lo, hi)
    if span[0] - getattr(procutil, "LOWEST_PORT", 10000) < getattr(procutil, "MIN_POOL", 2000):
        pytest.skip(f"ephemeral range {span} leaves no pool below it on this machine")
    return span


def test_free_ports_come_from_below_the_kernels_ephemeral_range() -> None:
    lo, _ = _below_range()
    ports = [free_port() for _ in range(50)]
    assert all(p < lo for p in ports), ports
    assert len(set(ports)) == len(ports)
    base = free_port_block(4)
    assert min(ports) >= procutil.LOWEST_PORT and max(ports) < procutil.HIGHEST_PORT  # not a Kubernetes NodePort either
    assert base >= procutil.LOWEST_PORT and base + 3 < lo


def test_the_kernels_pick_when_the_range_leaves_no_pool_below_it() -> None:
    port = free_port(ephemeral=(1024, 65535))
    assert 1024 <= port <= 65535


def test_an_address_not_of_this_machine_is_an_error_not_a_search() -> None:
    with pytest.raises(OSError):
        free_port("192.0.2.1")  # TEST-NET-1


def test_a_stripe_hands_out_only_its_residue_and_stays_in_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two xdist workers (stripes 0/2 and 1/2) can never draw one port; a malformed stripe is no stripe."""
    _below_range()
    monkeypatch.setenv(procutil.PORT_STRIPE_ENV, "1/3")
    ports = [free_port() for _ in range(200)]
    assert all(p % 3 == 1 and procutil.LOWEST_PORT <= p < procutil.HIGHEST_PORT for p in ports), ports
    monkeypatch.setenv(procutil.PORT_STRIPE_ENV, "3/3")
    assert procutil._stripe() == (0, 1)
    monkeypatch.setenv(procutil.PORT_STRIPE_ENV, "x")
    assert procutil._stripe() == (0, 1)


def test_free_port_never_names_the_control_planes_default_ports() -> None:
    """A test config given 18001 by free_port was refused as a clash with the control plane's default status port."""
    from dlb.config.model import ControlPlaneAddrs
    from dlb.procutil import DEFAULT_SERVICE_PORTS, _handed_out

    defaults = ControlPlaneAddrs()
    assert {defaults.xds.port, defaults.status.port} == DEFAULT_SERVICE_PORTS
    assert _handed_out >= DEFAULT_SERVICE_PORTS


def test_log_tail_reads_only_the_end_and_never_returns_a_cut_line(tmp_path) -> None:
    """``dlb up`` polls a root's log while it waits: only the last ``max_bytes`` are read, and the first line
    of that read (cut mid-line) is dropped; a short file comes back whole."""
    from dlb.procutil import log_tail

    log = tmp_path / "root.log"
    log.write_text("".join(f"line {k:05d}\n" for k in range(2000)))  # 11 bytes a line
    assert log_tail(log, 3) == "line 01997\nline 01998\nline 01999"
    tail = log_tail(log, 1000, max_bytes=105).splitlines()
    assert tail == [f"line {k:05d}" for k in range(1991, 2000)]  # 105 bytes: 9 whole lines after a cut one
    assert log_tail(tmp_path / "absent.log") == ""
