"""The leaf's access-log socket: a private directory, and a gate that checks who connects.

Why: the access log steers a cell (request starts are its RIF, completions its error rate), and it
used to be a socket at a predictable path in the shared ``/tmp``: another user could bind the path
first (the agent then did not start, and the Envoy logged into the squatter's socket) and two
testbeds on one box collided on it. Now:

- the socket's directory is private (mode 0700, owned by the agent's user, not a symlink): the agent
  makes it, or refuses to start naming who owns it (:func:`private_dir`);
- the agent's gRPC server listens inside a directory of its own made per run (``mkdtemp``, 0700,
  unguessable), and the configured socket is a :class:`PeerGate`: for each connection it reads the
  peer's credentials (``SO_PEERCRED``) and relays the bytes only if the peer runs as the agent's own
  user — what the leaf Envoy runs as beside it (``dlb up``, the testbed, the Kubernetes pod's
  ``runAsUser``). Anyone else is closed at once and counted (``dlb_leaf_als_peers_refused``).

A process of the agent's own user passes both checks: it is the agent's user. What such a stream
reports is undone when the stream ends (:meth:`dlb.ext_proc.leaf_state.LeafState.drop_owner`).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import shutil
import socket
import stat
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from dlb.log import get_logger

log = get_logger("dlb.leaf")

_UCRED = struct.Struct("3i")  # pid, uid, gid (struct ucred)


class GateError(OSError):
    """The socket's directory is not private, or the gate could not listen; the message names the path."""


def private_dir(path: Path) -> bool:
    """Make ``path`` a directory only this user can change: made with mode 0700, or checked to be one we
    own (a directory, not a symlink, no group or other write bit); GateError naming it if not. True
    when it was made here (so the agent may remove it at stop)."""
    made = True
    try:
        path.mkdir(mode=0o700, parents=False)
    except FileExistsError:
        made = False
    except OSError as exc:
        raise GateError(f"{path}: cannot make the access-log directory: {exc.strerror}") from None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise GateError(f"{path}: not a directory (a symlink or a file someone else put there)")
    if st.st_uid != os.geteuid():
        raise GateError(f"{path}: owned by uid {st.st_uid}, not this user ({os.geteuid()}): someone else made it first")
    if st.st_mode & 0o022:
        raise GateError(f"{path}: mode {stat.S_IMODE(st.st_mode):04o}: others may replace the socket in it (use a directory of its own, 0700)")
    return made


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a connected Unix socket."""
    return _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))


class _Relay(asyncio.Protocol):
    """One direction of a relayed connection: what arrives here is written to ``peer``."""

    def __init__(self, peer: asyncio.Transport | None = None) -> None:
        self.peer = peer
        self.transport: asyncio.Transport | None = None
        #: What arrived before ``peer`` was joined (uvloop may deliver it despite pause_reading).
        self.early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.peer is not None:
            self.peer.write(data)
        else:
            self.early.append(data)

    def eof_received(self) -> bool:
        if self.peer is not None and self.peer.can_write_eof():
            self.peer.write_eof()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None:
            self.peer.close()

    # Backpressure: when the other side stops reading, stop reading from this one.
    def pause_writing(self) -> None:
        if self.peer is not None:
            self.peer.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and not self.peer.is_closing():
            self.peer.resume_reading()


@dataclass
class PeerGate:
    """Listens on ``path`` and relays each connection from an allowed uid to ``inner`` (a Unix socket)."""

    path: str
    inner: str
    allowed_uids: frozenset[int] = field(default_factory=lambda: frozenset({os.geteuid()}))
    refused: int = 0
    relayed: int = 0
    _server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_unix_server(self._accepted, self.path)
        except OSError as exc:
            raise GateError(f"{self.path}: cannot listen: {exc.strerror}") from None

    def _accepted(self) -> asyncio.Protocol:
        return _Inbound(self)

    def check(self, sock: socket.socket) -> bool:
        """Whether the peer of ``sock`` may feed the access log (counted and logged when not)."""
        pid, uid, _ = peer_credentials(sock)
        if uid in self.allowed_uids:
            self.relayed += 1
            return True
        self.refused += 1
        if self.refused == 1 or self.refused % 1000 == 0:
            log.warning("als_peer_refused", pid=pid, uid=uid, allowed=sorted(self.allowed_uids), refused=self.refused)
        return False

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(OSError):
            os.unlink(self.path)


class _Inbound(_Relay):
    """The gate's side of a client connection: checked, then joined to a new connection to ``inner``."""

    def __init__(self, gate: PeerGate) -> None:
        super().__init__()
        self.gate = gate

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        t = self.transport
        assert t is not None
        if not self.gate.check(t.get_extra_info("socket")):
            t.abort()
            return
        t.pause_reading()  # until the inner connection exists
        asyncio.get_running_loop().create_task(self._join(t))

    async def _join(self, t: asyncio.Transport) -> None:
        try:
            inner, _ = await asyncio.get_running_loop().create_unix_connection(lambda: _Relay(t), self.gate.inner)
        except OSError:
            t.abort()
            return
        if t.is_closing():
            inner.close()
            return
        self.peer = inner
        inner.write(b"".join(self.early))
        self.early.clear()
        t.resume_reading()


#: Unix socket paths hold at most 107 bytes (``sun_path`` is 108 with the NUL).
MAX_SOCKET_PATH = 107
_GRPC_SOCKET = "grpc.sock"


@dataclass
class AgentSocketDir:
    """The directory of the agent's own gRPC socket behind the gate: made per run, removed at stop.

    It is made inside the access-log socket's private directory, named after the socket
    (``<socket>.<random>``), so an agent that was killed leaves it where the next agent on that socket
    finds it: that agent, having checked that no one serves the socket, removes the ones left for
    *its* socket (:meth:`in_private`; other agents' sockets may share the directory, as the testbed's
    do). Made in the shared ``/tmp`` instead, each killed agent left a directory behind for good.
    ``/tmp`` is the fallback when the path would be too long for a socket.
    """

    path: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="dlb-agent-")))

    @classmethod
    def in_private(cls, socket_path: Path) -> AgentSocketDir:
        """A new per-run directory beside ``socket_path`` (whose directory is private, checked by the
        caller, and which no one serves), after removing those earlier agents left for it."""
        prefix = socket_path.name + "."
        if len(str(socket_path)) + len(f".xxxxxxxx/{_GRPC_SOCKET}") > MAX_SOCKET_PATH:
            return cls()
        for old in socket_path.parent.glob(glob.escape(prefix) + "*"):
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
        return cls(Path(tempfile.mkdtemp(prefix=prefix, dir=socket_path.parent)))

    @property
    def grpc_socket(self) -> str:
        return str(self.path / _GRPC_SOCKET)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
