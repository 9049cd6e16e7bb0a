"""``free_port``: ports for configs that must name an address before the service that binds it runs.

The CI races (an Envoy's listener port taken between ``free_port()`` and the Envoy's bind, in
test_faults_e2e and test_up) came from the ephemeral range: every ``bind(port 0)`` on the machine
(other tests' servers, in this run and the ones beside it) draws there, as do outgoing connections'
source ports. Ports below that range are never handed out by the kernel, so only an explicit bind to
the same number can take one.
"""

from __future__ import annotations

import socket

import pytest
from test_procutil_unit import _below_range

from dlb import procutil
from dlb.procutil import free_port


def test_ports_handed_out_are_not_taken_by_other_sockets_bound_to_port_0() -> None:
    """What the races did: between free_port() and the service's bind, another server (this run's or
    a neighbour run's) bound port 0 and got the same number. 800 such sockets against 200 ports drawn
    by the kernel's pick take ~11 of them (the chance of none is ~1e-5); below the range, none."""
    import resource

    _below_range()
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 1000:
        pytest.skip("needs ~850 file descriptors")
    ports = {free_port() for _ in range(200)}
    others = []
    try:
        for _ in range(800):
            sock = socket.socket()
            others.append(sock)
            sock.bind(("127.0.0.1", 0))
        assert not ports & {sock.getsockname()[1] for sock in others}
    finally:
        for sock in others:
            sock.close()


def test_a_drawn_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    lo, _ = _below_range()
    with socket.socket() as taken:
        for candidate in range(procutil.LOWEST_PORT + 1, lo):  # a port below the range that this test can hold
            try:
                taken.bind(("127.0.0.1", candidate))
                break
            except OSError:
                continue
        taken.listen()
        draws = iter([candidate, candidate + 1 if candidate + 1 < lo else candidate - 1])
        monkeypatch.setattr(procutil._random, "randrange", lambda a, b: next(draws))
        monkeypatch.setattr(procutil, "_handed_out", set())
        assert free_port() != candidate


def test_python_dash_m_dlb_is_the_dlb_command() -> None:
    """``python -m dlb`` runs the CLI (a venv whose bin is not on PATH); it exits 2 on a bad command."""
    import subprocess
    import sys

    ok = subprocess.run([sys.executable, "-m", "dlb", "--help"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "theory" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "dlb", "no-such-command"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
