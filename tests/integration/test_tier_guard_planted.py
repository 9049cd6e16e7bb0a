"""The unit tier's guard, end to end: a planted unit test that opens a socket or starts a process fails.

A pytest run in a subprocess, on a copy of ``tests/unit/conftest.py`` with three planted tests: the two
that break the tier's rule fail with the message that says where they belong; the quiet one passes.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

PLANTED = '''
import socket
import subprocess
import sys


def test_talks_to_a_server():
    socket.create_connection(("127.0.0.1", 9), timeout=1)


def test_starts_a_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_stays_in_process():
    assert sorted([3, 1, 2]) == [1, 2, 3]
'''


def test_a_planted_unit_test_that_opens_a_socket_or_starts_a_process_fails(tmp_path: Path) -> None:
    unit = tmp_path / "tests" / "unit"
    unit.mkdir(parents=True)
    shutil.copy(TESTS / "unit" / "conftest.py", unit / "conftest.py")
    (unit / "test_planted.py").write_text(PLANTED)
    (tmp_path / "pytest.ini").write_text(f"[pytest]\npythonpath = {TESTS}\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", str(unit)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    out = run.stdout
    assert run.returncode == 1, out + run.stderr
    assert "2 failed, 1 passed" in out, out
    assert "test_talks_to_a_server: unit tests may not open sockets" in out, out
    assert "test_starts_a_process: unit tests may not start processes" in out, out
    assert out.count("move it to tests/integration") >= 2, out
