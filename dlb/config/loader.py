"""Load a DLB config: file or text or dict in, a checked frozen :class:`Config` out, or every problem at once.

The entry points services call; the work is split by job: :mod:`dlb.config.yaml_nodes` (YAML with
line numbers and budgets), :mod:`dlb.config.checker` (the generic field checker),
:mod:`dlb.config.schema` (the sections), :mod:`dlb.config.policy` (the policy plugins' registry),
:mod:`dlb.config.tls_check` (the ``tls`` files) and :mod:`dlb.config.hostport` (addresses).
"""

from __future__ import annotations

import os
from typing import Any

from dlb.config.hostport import HOSTNAME_RE, is_ip, parse_hostport
from dlb.config.model import Config
from dlb.config.problems import ConfigError, Problem
from dlb.config.schema import MAX_CELLS, MAX_ENDPOINTS, build
from dlb.config.tls_check import pem_problem, tls_pair_problems
from dlb.config.yaml_nodes import MAX_CONFIG_BYTES, MAX_DEPTH, MAX_VALUES, compose

#: Names other modules and tests import from here (kept when the file was split by job).
__all__ = [
    "HOSTNAME_RE",
    "MAX_CELLS",
    "MAX_CONFIG_BYTES",
    "MAX_DEPTH",
    "MAX_ENDPOINTS",
    "MAX_VALUES",
    "ConfigError",
    "Problem",
    "config_from_dict",
    "is_ip",
    "load_config",
    "parse_config",
    "parse_hostport",
    "pem_problem",
    "read_config_text",
    "tls_pair_problems",
]


def parse_config(text: str, source: str = "<string>") -> Config:
    """Parse YAML text; raises ConfigError listing every problem (``source`` names the file in messages)."""
    data, marks, problems = compose(text, source)
    return build(data, source, marks, problems)


def config_from_dict(data: dict[str, Any], source: str = "<dict>") -> Config:
    """Check and build a config from already-parsed data (tests, generated testbeds); no line numbers."""
    return build(data, source, {}, [])


def load_config(path: str | os.PathLike[str]) -> Config:
    """Load and check a config file. Services call this at start and refuse to run on ConfigError."""
    return parse_config(read_config_text(path), os.fspath(path))


def read_config_text(path: str | os.PathLike[str]) -> str:
    """A config file's text (at most :data:`MAX_CONFIG_BYTES`, UTF-8), or ConfigError naming the file."""
    source = os.fspath(path)
    try:
        with open(source, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)  # never read a huge file whole
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError([Problem(source, "", f"larger than the {MAX_CONFIG_BYTES:,} bytes a config may have")])
        text = raw.decode("utf-8")
    except OSError as exc:
        raise ConfigError([Problem(source, "", f"cannot read: {exc.strerror or exc}")]) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError([Problem(source, "", f"not UTF-8 text: {exc}")]) from exc
    return text
