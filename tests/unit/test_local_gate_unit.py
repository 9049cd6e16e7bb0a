"""The access-log socket's directory must be private (dlb/ext_proc/local_gate.py), and what one
access-log stream reported ends with it (the error rate too, not only its in-flight records)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_leaf_state import make

from dlb.core.estimator import ErrorTracker
from dlb.ext_proc.leaf_state import Completion
from dlb.ext_proc.local_gate import GateError, private_dir


def test_the_directory_is_made_0700_or_refused_when_someone_else_could_replace_the_socket(tmp_path: Path) -> None:
    made = tmp_path / "mine"
    assert private_dir(made) is True  # made here (the agent may remove it at stop)
    assert (made.stat().st_mode & 0o777) == 0o700
    assert private_dir(made) is False  # ours already: fine, and not ours to remove
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(GateError, match="shared: mode 0777"):
        private_dir(shared)
    link = tmp_path / "link"
    link.symlink_to(made)
    with pytest.raises(GateError, match="not a directory"):
        private_dir(link)
    if os.geteuid() == 0:  # a squatter's directory (root can make one owned by another user)
        squat = tmp_path / "squat"
        squat.mkdir(mode=0o700)
        os.chown(squat, 65534, 65534)
        with pytest.raises(GateError, match="owned by uid 65534"):
            private_dir(squat)


def test_removing_a_part_leaves_exactly_the_rest() -> None:
    whole, part, rest = ErrorTracker(5.0), ErrorTracker(5.0), ErrorTracker(5.0)
    for t, err, mine in ((0.0, False, False), (0.5, True, True), (1.0, True, True), (2.0, False, False), (3.0, True, False)):
        whole.record(t, err)
        (part if mine else rest).record(t, err)
    whole.remove(part, 4.0)
    assert whole.rate(4.0) == pytest.approx(rest.rate(4.0))


def test_a_streams_fake_errors_end_with_the_stream() -> None:
    """A local peer's stream of 503s raised the error rate roots see, and after it closed the rate stayed
    (0.51): now the outcomes a stream reported are taken back when it ends; another stream's stay."""
    st, real = make(2), ErrorTracker(make(2).error_tau_s)
    for i in range(20):
        st.complete(1.0, Completion(f"real-{i}", "", 200 if i % 10 else 503, 0.1), owner=1)
        real.record(1.0, i % 10 == 0)
    for i in range(2000):
        st.complete(1.5, Completion(f"fake-{i}", "", 503, 0.1), owner=2)
    assert st.errors.rate(1.5) > 0.9
    st.drop_owner(2, 2.0)
    assert st.errors.rate(2.0) == pytest.approx(real.rate(2.0))
