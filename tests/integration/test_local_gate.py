"""The access-log socket's gate (dlb/ext_proc/local_gate.py) with real Unix sockets and a real peer of
another user: it relays the agent's own user and refuses anyone else, counted, whatever the socket's
file mode lets through.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from dlb.ext_proc.local_gate import PeerGate

pytestmark = pytest.mark.timeout(60)

#: A peer that sends "hi" and prints what comes back (nothing if the gate closes on it).
PEER = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1]); s.settimeout(5)
try:
    s.sendall(b"hi")
    print(s.recv(100).decode() or "closed")
except OSError:
    print("closed")
"""


async def _scenario(tmp: Path) -> tuple[str, str, int, int]:
    async def upper(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write((await reader.read(100)).upper())
        await writer.drain()
        writer.close()

    inner = str(tmp / "inner.sock")
    server = await asyncio.start_unix_server(upper, inner)
    gate = PeerGate(str(tmp / "als.sock"), inner)
    await gate.start()
    os.chmod(tmp, 0o755)
    os.chmod(gate.path, 0o777)  # a shared volume or a careless mode: the file mode lets anyone connect

    async def peer(user: int | None) -> str:
        proc = await asyncio.create_subprocess_exec("/usr/bin/python3", "-c", PEER, gate.path, user=user, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out, _ = await proc.communicate()
        return out.decode().strip()

    mine = await peer(None)
    other = await peer(65534)
    await gate.stop()
    server.close()
    return mine, other, gate.relayed, gate.refused


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"), reason="needs root to run a peer as another user")
def test_a_peer_of_another_user_is_refused_and_counted() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mine, other, relayed, refused = asyncio.run(_scenario(Path(tmp)))
    assert mine == "HI" and relayed == 1
    assert other == "closed" and refused == 1
