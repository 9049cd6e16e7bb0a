"""research/manifest.json lists every run artefact with its true checksum, and none is left under docs/.

Why: artefacts are records; a changed or unlisted one breaks the link between a figure, its command and
its commit. Regenerate the manifest with ``python research/manifest.py``. In-process, no git.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESEARCH = REPO / "research"
ARTEFACT_SUFFIXES = (".json", ".json.gz", ".jsonl", ".png", ".txt")
HEX40 = set("0123456789abcdef")


def manifest() -> list[dict]:
    return json.loads((RESEARCH / "manifest.json").read_text())


def artefacts(root: Path) -> set[str]:
    return {p.relative_to(REPO).as_posix() for p in root.rglob("*")
            if p.is_file() and p.name.endswith(ARTEFACT_SUFFIXES) and p.name != "manifest.json"}


def test_every_artefact_is_listed_once() -> None:
    paths = [e["path"] for e in manifest()]
    assert len(paths) == len(set(paths))
    assert set(paths) == artefacts(RESEARCH)


def test_checksums_match() -> None:
    wrong = [e["path"] for e in manifest() if hashlib.sha256((REPO / e["path"]).read_bytes()).hexdigest() != e["sha256"]]
    assert wrong == []


def test_each_entry_has_a_command_and_a_commit() -> None:
    for e in manifest():
        assert e["command"].strip(), e["path"]
        commit = e["commit"].removesuffix("+dirty")
        assert len(commit) == 40 and set(commit) <= HEX40, e["path"]


def test_no_artefacts_under_docs() -> None:
    assert artefacts(REPO / "docs") == set()


def test_a_changed_artefact_is_caught(tmp_path: Path) -> None:
    """Plant: the same check on a copy whose bytes differ from the listed checksum fails."""
    entry = manifest()[0]
    copy = tmp_path / "copy"
    copy.write_bytes((REPO / entry["path"]).read_bytes() + b"\n")
    assert hashlib.sha256(copy.read_bytes()).hexdigest() != entry["sha256"]
