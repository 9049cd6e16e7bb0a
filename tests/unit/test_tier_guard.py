"""The unit tier's guard (tests/tier_guard.py): each way of opening a socket or starting a process is stopped.

These run under the tier's own guard; the nested guard here records the attempt, so the outer one stays clean.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import grpc.aio
import pytest
from tier_guard import TierViolation, guarding

from dlb.procutil import free_port


def _refused(attempt, kind: str) -> None:
    with guarding() as guard:
        with pytest.raises(TierViolation, match=f"unit tests may not {kind} .*; move it to tests/integration"):
            attempt()
    assert len(guard.violations) == 1 and kind in guard.violations[0]


def test_connect_and_bind_are_refused() -> None:
    with socket.socket() as s:
        _refused(lambda: s.connect(("127.0.0.1", 9)), "open sockets")
        _refused(lambda: s.bind(("127.0.0.1", 0)), "open sockets")
        _refused(lambda: s.connect_ex(("127.0.0.1", 9)), "open sockets")
    _refused(lambda: socket.create_connection(("127.0.0.1", 9), timeout=1), "open sockets")


def test_processes_are_refused() -> None:
    _refused(lambda: subprocess.run([sys.executable, "-c", "pass"], check=False), "start processes")
    _refused(lambda: os.system("true"), "start processes")
    _refused(lambda: multiprocessing.get_context("spawn").Process(target=print).start(), "start processes")

    async def child() -> None:
        await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")

    _refused(lambda: asyncio.run(child()), "start processes")


def test_asyncio_and_grpc_servers_are_refused() -> None:
    async def serve() -> None:
        await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)

    _refused(lambda: asyncio.run(serve()), "start servers")
    _refused(grpc.server, "open sockets")
    _refused(grpc.aio.server, "open sockets")
    _refused(lambda: grpc.insecure_channel("127.0.0.1:9"), "open sockets")


def test_a_free_port_number_for_a_config_is_allowed() -> None:
    with guarding() as guard:
        port = free_port()
    assert 0 < port < 65536 and guard.violations == []


def test_nested_guards_record_only_in_the_innermost() -> None:
    with guarding() as outer:
        with guarding() as inner, pytest.raises(TierViolation):
            socket.create_connection(("127.0.0.1", 9), timeout=1)
        assert len(inner.violations) == 1
    assert outer.violations == []


def test_every_test_file_sits_in_a_tier_folder_under_a_unique_name() -> None:
    """Tiers are folders (the markers come from them); the import mode needs each test module's name once."""
    tests = Path(__file__).resolve().parents[1]
    assert sorted(p.name for p in tests.glob("test_*.py")) == []  # none outside a tier
    names = [p.name for p in tests.glob("*/test_*.py")]
    assert {p.parent.name for p in tests.glob("*/test_*.py")} == {"unit", "integration", "e2e"}
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
