"""A component whose certificate names another identity is refused at start, naming the field and the SAN it
found (a stranger's control plane started with leaf-east's pair ran silently; every Envoy refused it)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dlb.config import ConfigError
from dlb.config.tls_live import component_identity
from dlb.testbed.pki import dlb_pki


def test_a_certificate_of_another_identity_is_refused_at_start(tmp_path: Path) -> None:
    tls, _ = dlb_pki(tmp_path, ("a",))
    assert component_identity(tls, "control-plane") is not None and component_identity(tls, "leaf", "a") is not None
    ours = tmp_path / "ours"
    for suffix in (".pem", "-key.pem"):  # the control plane given leaf a's pair
        shutil.copy(ours / f"leaf-a{suffix}", ours / f"control-plane{suffix}")
    with pytest.raises(ConfigError) as info:
        component_identity(tls, "control-plane")
    (problem,) = info.value.problems
    assert problem.path == "tls.cert" and "spiffe://dlb/leaf/a" in problem.reason and "spiffe://dlb/control-plane" in problem.reason
    assert component_identity(tls, "leaf", "a") is not None
