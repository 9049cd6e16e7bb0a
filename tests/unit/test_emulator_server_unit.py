"""The emulator over real sockets on 127.0.0.1: OpenAI wire format, streaming, metrics, overload,

Here: the tests that run in-process (no sockets, no processes);
the others: ``tests/integration/test_emulator_server.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

from dlb import cli

# -- wire format -------------------------------------------------------------------------------------------


# -- load: metrics, queueing, overflow, disconnects -------------------------------------------------------


# -- fault knobs ----------------------------------------------------------------------------------------


# -- threaded and child-process runners, CLI -------------------------------------------------------------


def test_cli_rejects_bad_configuration() -> None:
    assert cli.main(["serve", "emulator", "--profile", "no-such-profile", "--port", "0"]) == 2
    assert cli.main(["serve", "emulator", "--profile", "fast-test", "--error-rate", "3", "--port", "0"]) == 2
