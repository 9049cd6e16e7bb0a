"""A client reaching a leaf Envoy directly cannot steer it with internal headers (issue 14 row 9).

Here: the tests that run in-process (no sockets, no processes);
the others: ``tests/integration/test_leaf_internal_headers.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dlb.config import ConfigError, config_from_dict
from dlb.envoy.root_token import root_token


def test_root_token_file_problems_name_the_field(tmp_path: Path) -> None:
    short = tmp_path / "short"
    short.write_text("abc")
    base = {"version": 1, "cells": [{"name": "a", "servers": ["127.0.0.1:1"], "leaf": {"address": "127.0.0.1:2", "probe": "127.0.0.1:3"}}],
            "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}}]}
    for value, words in ((str(short), "16-256 printable"), (str(tmp_path / "missing"), "cannot read"), (7, "file path")):
        with pytest.raises(ConfigError) as exc:
            config_from_dict(dict(base, root_token_file=value))
        assert "root_token_file" in str(exc.value) and words in str(exc.value)
    derived = root_token(config_from_dict(base))
    assert derived == root_token(config_from_dict(base)) and derived.startswith("derived-")  # every renderer agrees


def test_the_token_file_dlb_up_generates_is_used_when_the_config_names_none(tmp_path: Path, monkeypatch) -> None:
    """``dlb up`` hands its per-run token to every child in DLB_ROOT_TOKEN_FILE; a config's own file wins."""
    from dlb.config.schema import ROOT_TOKEN_ENV

    base = {"version": 1, "cells": [{"name": "a", "servers": ["127.0.0.1:1"], "leaf": {"address": "127.0.0.1:2", "probe": "127.0.0.1:3"}}],
            "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}}]}
    generated, own = tmp_path / "generated", tmp_path / "own"
    generated.write_text("g" * 32 + "\n")
    own.write_text("o" * 32)
    monkeypatch.setenv(ROOT_TOKEN_ENV, str(generated))
    assert root_token(config_from_dict(base)) == "g" * 32
    assert root_token(config_from_dict(dict(base, root_token_file=str(own)))) == "o" * 32
