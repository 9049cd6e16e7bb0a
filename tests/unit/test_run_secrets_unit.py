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
    assert env == {} and [line.split(":")[:2] for line in said] == [["warning", " --insecure"]], said  # plaintext, said


def test_a_mounted_kubernetes_tls_secret_is_the_tls_section(tmp_path: Path, monkeypatch) -> None:
    """``DLB_TLS_SECRET_DIR``: the pod's cert-manager Secret (ca.crt, tls.crt, tls.key), checked at load
    like any plain ``tls`` path, with Envoys' SDS files beside it; a Secret whose certificate is not from
    its CA is refused, naming the file."""
    import shutil

    import pytest

    from dlb.config import ConfigError
    from dlb.testbed.pki import dlb_pki

    ours, theirs = dlb_pki(tmp_path / "pki", ("a",))
    secret = tmp_path / "secret"
    secret.mkdir()
    shutil.copy(ours.ca, secret / "ca.crt")
    shutil.copy(ours.cert_for("leaf-a"), secret / "tls.crt")
    shutil.copy(ours.key_for("leaf-a"), secret / "tls.key")
    monkeypatch.setenv("DLB_TLS_SECRET_DIR", str(secret))
    monkeypatch.setenv("DLB_TLS_DIR", str(tmp_path / "ignored"))  # the Secret wins over dlb up's folder
    cfg = config_from_dict(RAW)
    assert cfg.tls is not None and (cfg.tls.ca, cfg.tls.cert, cfg.tls.key) == tuple(str(secret / f) for f in ("ca.crt", "tls.crt", "tls.key"))
    assert load_identity(cfg.tls, "leaf-a").cert == (secret / "tls.crt").read_bytes()
    assert cfg.tls.envoy_sds == f"{secret}-sds"  # where its Envoys' SDS files are (the clusters it pushes name them)
    shutil.copy(theirs.cert_for("leaf-a"), secret / "tls.crt")
    shutil.copy(theirs.key_for("leaf-a"), secret / "tls.key")
    with pytest.raises(ConfigError, match=r"tls\.crt"):
        config_from_dict(RAW)
