"""What ``dlb up`` makes per run when the config brings none (dlb/launch/run_secrets.py): a random root
token and a private CA, taken by the config loader from the environment only when the config is silent."""

from __future__ import annotations

from pathlib import Path

from dlb.config import config_from_dict
from dlb.config.tls import load_identity
from dlb.envoy.root_token import root_token
from dlb.launch.run_secrets import run_env

RAW = {"version": 1, "cells": [{"name": "a", "servers": ["127.0.0.1:1"], "leaf": {"address": "127.0.0.1:2", "probe": "127.0.0.1:3"}}],
       "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}}]}


def test_a_silent_config_gets_a_private_token_and_ca(tmp_path: Path, monkeypatch) -> None:
    env, said = run_env(config_from_dict(RAW), tmp_path, insecure=False)
    assert len(said) == 2 and set(env) == {"DLB_ROOT_TOKEN_FILE", "DLB_TLS_DIR"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cfg = config_from_dict(RAW)
    assert cfg.tls is not None and cfg.tls.ca.startswith(env["DLB_TLS_DIR"])
    assert root_token(cfg) == Path(env["DLB_ROOT_TOKEN_FILE"]).read_text().strip() and not root_token(cfg).startswith("derived-")
    assert load_identity(cfg.tls, "leaf-a") is not None  # the certificate for each component is there
    key = Path(env["DLB_TLS_DIR"]) / "leaf-a-key.pem"
    assert key.stat().st_mode & 0o777 == 0o600


def test_insecure_makes_no_ca_and_a_config_with_its_own_makes_nothing(tmp_path: Path) -> None:
    env, _ = run_env(config_from_dict(RAW), tmp_path, insecure=True)
    assert set(env) == {"DLB_ROOT_TOKEN_FILE"}
    token = tmp_path / "mine"
    token.write_text("m" * 32)
    env, said = run_env(config_from_dict(dict(RAW, root_token_file=str(token))), tmp_path / "b", insecure=True)
    assert env == {} and said == []
