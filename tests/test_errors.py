"""Libraries raise typed errors under one root (``DlbError``); only the command line turns them into exits."""

from __future__ import annotations

import asyncio
import socket

import pytest

from dlb import cli
from dlb.config import ConfigError
from dlb.errors import BindError, DlbError
from dlb.ext_proc.protocol import ExtProcServer


def _handler(message: bytes) -> tuple[bytes | None, bool]:
    return None, True


@pytest.mark.parametrize("transport", ["h2", "grpc"])
def test_bind_to_a_port_in_use_raises_bind_error(transport: str) -> None:
    """A service that cannot listen raises BindError naming the address, instead of exiting the process."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"

        async def main() -> None:
            server = ExtProcServer(transport, _handler)
            try:
                await server.bind(address)
            finally:
                await server.stop(0)

        with pytest.raises(BindError, match=address):
            asyncio.run(main())


def test_malformed_listen_address_raises_bind_error() -> None:
    """A listen address without a numeric port is a BindError (a DlbError), not SystemExit."""
    with pytest.raises(DlbError, match="not a number"):
        asyncio.run(ExtProcServer("h2", _handler).bind("127.0.0.1:http"))


def test_project_errors_share_the_root() -> None:
    """Every project error class derives from DlbError, and from the built-in error that describes it."""
    from dlb.config.resources import ResourceError
    from dlb.envoy.binary import EnvoyNotFound
    from dlb.xds.snapshot import SnapshotError
    from dlb.xds.stream import StreamError

    for cls in (ConfigError, ResourceError, SnapshotError, StreamError, EnvoyNotFound, BindError):
        assert issubclass(cls, DlbError), cls
    assert issubclass(ConfigError, ValueError) and issubclass(BindError, OSError)


def test_command_line_prints_the_error_and_exits_1(tmp_path, capsys) -> None:
    """The CLI catches a DlbError from a command, prints it with the file name, and returns exit code 1."""
    missing = tmp_path / "missing.yaml"
    assert cli.main(["serve", "root", "--config", str(missing), "--cell", "a"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("dlb: ") and str(missing) in err


@pytest.mark.parametrize(("flag", "value"), [("--max-concurrent-streams", "0"), ("--idle-timeout-s", "-1"),
                                             ("--handshake-timeout-s", "0"), ("--max-connections", "-5")])
def test_bad_h2_limits_on_the_command_line_name_the_flag(flag: str, value: str) -> None:
    """A bound of the HTTP/2 transport out of range stops `dlb serve root` with a message naming the flag."""
    with pytest.raises(SystemExit, match=f"^{flag} must be"):
        cli.main(["serve", "root", "--cell", "a", "--xds", "127.0.0.1:1", "--listen", "127.0.0.1:0", flag, value])
