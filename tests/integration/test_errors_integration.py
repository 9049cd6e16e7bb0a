"""Libraries raise typed errors under one root (``DlbError``); only the command line turns them into exits.

Here: the tests that start dlb services, open sockets or run subprocesses;
the others: ``tests/unit/test_errors.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

import asyncio
import socket

import pytest
from test_errors import _handler

from dlb.errors import BindError
from dlb.ext_proc.protocol import ExtProcServer


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
