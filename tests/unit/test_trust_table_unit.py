"""docs/security.md states who may reach what as a table; every address a deployment listens on must
have its row there (named by its config field), so a new port cannot ship without its trust model."""

from __future__ import annotations

import re
from pathlib import Path

from dlb.config import config_from_dict
from dlb.launch.up import listen_addresses

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
#: Listened on beside what listen_addresses returns (``dlb up`` checks only TCP ports it must bind first).
ALSO = ("cells[].leaf.access_log",)


def table_fields(text: str) -> set[str]:
    """Config fields named in backticks in the first column of the trust-boundary table."""
    start = text.index("| port / channel | meant for | protection |")
    rows = text[start:].split("\n\n", 1)[0].splitlines()[2:]
    return {f for row in rows for f in re.findall(r"`([a-z_]+(?:\[\])?(?:\.[a-z_]+)+)`", row.split("|")[1])}


def listened_fields() -> set[str]:
    raw = {"version": 1, "cells": [{"name": "a", "servers": ["10.0.0.1:8000"],
                                    "leaf": {"address": "10.0.1.1:80", "probe": "10.0.1.1:81", "ext_proc": "10.0.1.1:82"},
                                    "root": {"address": "10.0.2.1:80", "ext_proc": "127.0.0.1:18080"}}],
           "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}}]}
    # "services.root.metrics + 1 (root c)": the field, then which root of several
    fields = {re.sub(r"\[\d+\]", "[]", f.split(" ")[0]) for f, _ in listen_addresses(config_from_dict(raw))}
    return fields | set(ALSO)


def test_every_listened_address_has_a_row_in_the_trust_table() -> None:
    missing = listened_fields() - table_fields(DOC.read_text(encoding="utf-8"))
    assert not missing, f"docs/security.md trust table has no row for {sorted(missing)}"


def test_a_row_taken_out_is_found() -> None:
    text = DOC.read_text(encoding="utf-8")
    row = next(ln for ln in text.splitlines() if "`cells[].leaf.probe`" in ln)
    assert "cells[].leaf.probe" in listened_fields() - table_fields(text.replace(row + "\n", ""))
