"""Which code produced a result (dlb.provenance): the commit and the id of dlb/ itself."""

from __future__ import annotations


def test_code_tree_names_the_code_on_disk(tmp_path, monkeypatch) -> None:
    """The id of dlb/: HEAD's tree when clean; with any change (edit, new file) the tree that change
    would commit plus '+dirty', so two different edits never share an id; HEAD, the index and the
    working tree are left as they were."""
    import subprocess

    from dlb import provenance

    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), *a], capture_output=True, text=True, check=True).stdout

    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    (tmp_path / "dlb").mkdir()
    (tmp_path / "dlb" / "a.py").write_text("x = 1\n")
    (tmp_path / "README").write_text("r\n")
    git("add", "-A")
    git("commit", "-qm", "c")
    monkeypatch.setattr(provenance, "_ROOT", tmp_path)
    clean = provenance.code_tree()
    assert clean == git("rev-parse", "HEAD:dlb").strip()
    (tmp_path / "README").write_text("docs only\n")
    assert provenance.code_tree() == clean  # outside dlb/: the same code
    (tmp_path / "dlb" / "a.py").write_text("x = 2\n")
    one = provenance.code_tree()
    (tmp_path / "dlb" / "a.py").write_text("x = 3\n")
    two = provenance.code_tree()
    assert one.endswith("+dirty") and two.endswith("+dirty") and len({clean, one, two}) == 3
    (tmp_path / "dlb" / "a.py").write_text("x = 1\n")
    (tmp_path / "dlb" / "new.py").write_text("y = 1\n")
    assert provenance.code_tree().endswith("+dirty") and provenance.git_commit().endswith("+dirty")
    assert git("status", "--porcelain") == " M README\n?? dlb/new.py\n"  # nothing staged by the id
