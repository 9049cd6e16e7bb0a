"""Which code produced a result: every results file records it, and reports refuse to mix builds.

One definition for the simulator, the benchmarks and the demo (there were four): ``git rev-parse HEAD``
of the checkout this package runs from, ``+dirty`` when ``dlb/`` differs from it (a modified, deleted or
new file), ``unknown`` outside a git checkout; and :func:`code_tree`, the id of the code itself. Call
them when a run *starts*: a commit made while a long run is going must not get the credit for its
numbers.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(["git", "-C", str(_ROOT), *args], capture_output=True, text=True, timeout=10, check=True,
                          env=env).stdout.strip()  # fmt: skip


def _dlb_changed() -> bool:
    """Whether ``dlb/`` on disk differs from HEAD's: a modified, deleted or new (untracked) file."""
    return bool(_git("status", "--porcelain", "--untracked-files=all", "--", "dlb"))


def git_commit() -> str:
    """``<sha>``, ``<sha>+dirty`` or ``unknown``."""
    try:
        head = _git("rev-parse", "HEAD")
        dirty = _dlb_changed()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head + ("+dirty" if dirty else "")) if head else "unknown"


def code_tree() -> str:
    """The git tree id of ``dlb/`` as it is on disk: ``<tree>`` when it is HEAD's, ``<tree>+dirty``
    when it is not, ``unknown`` outside a git checkout.

    Two commits with the same tree ran the same code: a long protocol run resumed after a commit that
    touched only docs or tests is still one build's numbers (``dlb sim --resume``, ``dlb sim report``).
    A changed ``dlb/`` gets the id of the tree it *would* commit (a scratch index: ``git add -A dlb``,
    ``git write-tree``), so two different uncommitted edits never pass for one build; its blobs go
    into the object store as ``git stash create`` would put them, and HEAD, the index and the working
    tree are not touched.
    """
    try:
        if not _dlb_changed():
            return _git("rev-parse", "HEAD:dlb") or "unknown"
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "GIT_INDEX_FILE": os.path.join(tmp, "index")}
            _git("read-tree", "HEAD", env=env)
            _git("add", "-A", "--", "dlb", env=env)
            tree = _git("write-tree", "--prefix=dlb/", env=env)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{tree}+dirty" if tree else "unknown"
