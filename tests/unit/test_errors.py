"""Libraries raise typed errors under one root (``DlbError``); only the command line turns them into exits."""

from __future__ import annotations

import asyncio
import re

import pytest

from dlb import cli
from dlb.config import ConfigError
from dlb.errors import BindError, DlbError
from dlb.ext_proc.protocol import ExtProcServer


def _handler(message: bytes) -> tuple[bytes | None, bool]:
    return None, True


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
                                             ("--handshake-timeout-s", "0"), ("--max-connections", "-5"),
                                             # a SETTINGS value is 32 bits: this one used to start, then fail
                                             # every connection Envoy opened (struct.error in the preface)
                                             ("--max-concurrent-streams", str(2**32)),
                                             # no bound at all, silently: the slow-loris the bound is for is back
                                             ("--handshake-timeout-s", "inf"), ("--idle-timeout-s", "nan"),
                                             ("--drain-s", "nan"), ("--drain-s", "inf")])
def test_bad_h2_limits_on_the_command_line_name_the_flag(flag: str, value: str, capsys) -> None:
    """A bound of the HTTP/2 transport out of range stops `dlb serve root` with a message naming the flag."""
    assert cli.main(["serve", "root", "--cell", "a", "--xds", "127.0.0.1:1", "--listen", "127.0.0.1:0", flag, value]) == 1
    assert capsys.readouterr().err.startswith(f"dlb: {flag} must be")


def test_h2_limits_refuse_settings_that_cannot_be_sent() -> None:
    """Every bound the transport advertises in SETTINGS fits the frame's 32-bit value."""
    from dlb.transport.limits import H2Limits

    for name in ("max_concurrent_streams", "max_header_list"):
        with pytest.raises(ValueError, match=f"H2Limits.{name} must be <= 4294967295"):
            H2Limits(**{name: 2**32})
    H2Limits(max_concurrent_streams=2**32 - 1, max_header_list=2**32 - 1)


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_leaf_drain_must_be_a_finite_duration(value: str, tmp_path, capsys) -> None:
    """`dlb serve leaf --drain-s nan` used to start and skip the drain; inf never closed the listener."""
    assert cli.main(["serve", "leaf", "--config", str(tmp_path / "none.yaml"), "--cell", "a", "--drain-s", value]) == 1
    assert capsys.readouterr().err.startswith("dlb: --drain-s must be >= 0 and finite")


def test_a_connection_cap_above_the_descriptor_limit_is_refused(capsys) -> None:
    """`--max-connections` beyond the process's file-descriptor limit could never be reached: accept()
    would fail with EMFILE first, and the probes, xDS and /metrics sockets with it."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        pytest.skip("no file-descriptor limit")
    assert cli.main(["serve", "root", "--cell", "a", "--xds", "127.0.0.1:1", "--listen", "127.0.0.1:0",
                     "--max-connections", str(soft)]) == 1
    assert re.match(r"dlb: --max-connections must be <= \d+ \(the file-descriptor limit", capsys.readouterr().err)
