"""dlb.config.tls_live.LiveIdentity's rules, in-process: when changed files are taken into use and when not."""

from __future__ import annotations

from pathlib import Path

from dlb.config.tls import load_identity_files
from dlb.config.tls_live import LiveIdentity, ReloadCounts
from dlb.testbed.pki import Pki, SecretDir


def test_a_pair_is_taken_once_it_works_and_a_broken_one_is_refused_once(tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki")
    first, renewed, other = (pki.issue(n) for n in ("first", "renewed", "other"))
    ca = pki.ca_path.read_bytes()
    secret = SecretDir(tmp_path / "dlb-tls")
    secret.publish(ca, first[0].read_bytes(), first[1].read_bytes())
    counts = ReloadCounts()
    live = LiveIdentity(load_identity_files(secret.tls.ca, secret.tls.cert, secret.tls.key), counts)
    renewal = live.renewal()
    assert not live.refresh() and renewal() is None  # nothing changed

    secret.publish(ca, other[0].read_bytes(), renewed[1].read_bytes())  # another certificate's key
    assert not live.refresh() and not live.refresh()
    assert (counts.failures, counts.reloads, live.generation) == (1, 0, 0)  # refused once per state of the files
    assert live.current.cert == first[0].read_bytes() and renewal() is None

    secret.publish(ca, renewed[0].read_bytes(), renewed[1].read_bytes())
    assert live.refresh()
    assert (counts.failures, counts.reloads, live.generation) == (1, 1, 1)
    assert live.current.cert == renewed[0].read_bytes()
    assert renewal() is not None and renewal() is None  # new credentials once per renewal, per client
    assert live.renewal()() is None  # a client made after the renewal already has the pair
