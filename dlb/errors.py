"""The root of DLB's own errors: libraries raise these, only the command line turns them into exits.

Why one root: a command's ``run()`` (and ``dlb.cli.main``) can then catch "anything DLB refused to
do" in one place and print it, while library code stays usable from tests, benchmarks and other
services without a ``SystemExit`` ending the caller's process. Subclasses also derive from the
built-in error that describes them (``ValueError`` for bad input), so existing ``except`` clauses
keep working. Codes that travel on the wire (HTTP/2 error codes, gRPC statuses) ride on the error
as ``code`` (see ``dlb.transport.h2``).
"""

from __future__ import annotations


class DlbError(Exception):
    """Something DLB refused to do; ``str(exc)`` is the message for the operator."""


class BindError(DlbError, OSError):
    """A service could not listen on an address (in use, not permitted, malformed)."""

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(f"cannot listen on {address}: {reason}")
        self.address = address
        self.reason = reason


class StartupError(DlbError, RuntimeError):
    """A service or one of its worker processes did not come up."""


class UsageError(DlbError, ValueError):
    """A command's options or input files cannot be used (a bad value, an unwritable output path)."""
