"""The emulator over real sockets on 127.0.0.1: OpenAI wire format, streaming, metrics, overload,
fault knobs, and the three ways to run it (async in-process, threaded, child process)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from dlb import cli
from dlb.emulator import EmulatorServer

T = TypeVar("T")


def run(coro: Awaitable[T], timeout: float = 60.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


def emulator(**kw: Any) -> EmulatorServer:
    kw.setdefault("profile", "fast-test")
    kw.setdefault("server_id", "emu-test")
    return EmulatorServer(**kw)


# -- wire format -------------------------------------------------------------------------------------------


# -- load: metrics, queueing, overflow, disconnects -------------------------------------------------------


# -- fault knobs ----------------------------------------------------------------------------------------


# -- threaded and child-process runners, CLI -------------------------------------------------------------


def test_cli_rejects_bad_configuration() -> None:
    assert cli.main(["serve", "emulator", "--profile", "no-such-profile", "--port", "0"]) == 2
    assert cli.main(["serve", "emulator", "--profile", "fast-test", "--error-rate", "3", "--port", "0"]) == 2
