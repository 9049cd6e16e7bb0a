"""``dlb bench hostile`` rows 9 and 10: a local process against the leaf's access-log socket.

Row 9 (local injection): a process of *another* user tries the socket (it needs root to run one: the
bench runs ``/usr/bin/python3`` as uid 65534), then a process of the agent's own user streams 200,000
fake starts and 2,000 fake 503s through it and closes; the row reports whether the other user got in,
what the leaf reported while the stream was open and after it closed. Row 10 (path squatting): another
user binds the paths a squatter can predict (the default socket path of cell a's leaf, in a directory
it made, and the path older versions used), then cell a's agent restarts; the row reports whether it
came back and Envoy's access log reached it. Both judge the real traffic like every row.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

OTHER_UID = 65534  # nobody
SYSTEM_PYTHON = "/usr/bin/python3"  # the bench's own interpreter may sit where another user cannot run it

#: Connects to argv[1], sends the HTTP/2 preface, prints what happened.
_TRY = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
    s.settimeout(3)
    s.sendall(b"PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n")
    print("answered" if s.recv(100) else "closed by the gate")
except OSError as e:
    print(type(e).__name__)
"""

#: Makes each directory in argv[2:] (mode 0777) and binds a socket at argv[1] and at <dir>/als.sock; waits.
_SQUAT = """
import os, socket, sys, time
socks = []
for path in sys.argv[1:]:
    if path.endswith("/"):
        os.makedirs(path, exist_ok=True); os.chmod(path, 0o777); path += "als.sock"
    s = socket.socket(socket.AF_UNIX); s.bind(path); os.chmod(path, 0o777); s.listen(); socks.append(s)
print("squatting", flush=True)
time.sleep(600)
"""


def can_run_other_user() -> bool:
    return os.geteuid() == 0 and os.path.exists(SYSTEM_PYTHON)


def other_user_try(path: str) -> str:
    """What a process of another user gets at the socket ``path`` (e.g. PermissionError, closed by the gate)."""
    if not can_run_other_user():
        return "skipped: needs root"
    out = subprocess.run([SYSTEM_PYTHON, "-c", _TRY, path], check=False, user=OTHER_UID, capture_output=True, timeout=30, cwd="/")
    return (out.stdout.decode().strip() or out.stderr.decode().strip()[-200:]) or f"exit {out.returncode}"


def predictable_paths(probe_host: str, probe_port: int) -> list[str]:
    """The default socket directory of a leaf with this probe address, and the path older versions used."""
    name = f"{probe_host.strip('[]').replace(':', '_')}-{probe_port}"
    return [f"/tmp/dlb-als-{name}/", f"/tmp/dlb-als-{name}.sock"]


@contextlib.contextmanager
def squatting(paths: list[str]) -> Iterator[bool]:
    """Another user binds ``paths`` (a trailing '/' makes a 0777 directory with ``als.sock`` in it) until
    the block ends, then everything it made is removed. Yields False when no other user can be run."""
    if not can_run_other_user() or any(os.path.exists(p.rstrip("/")) for p in paths):
        yield False
        return
    proc = subprocess.Popen([SYSTEM_PYTHON, "-c", _SQUAT, *paths], user=OTHER_UID, stdout=subprocess.PIPE, cwd="/")
    try:
        assert proc.stdout is not None
        ok = proc.stdout.readline().strip() == b"squatting"
        yield ok
    finally:
        proc.kill()
        proc.wait(10)
        for p in paths:
            if p.endswith("/"):
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    Path(p).unlink()
