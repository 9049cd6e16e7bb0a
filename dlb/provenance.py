"""Which code produced a result: every results file records it, and reports refuse to mix commits.

One definition for the simulator, the benchmarks and the demo (there were four): ``git rev-parse HEAD``
of the checkout this package runs from, ``+dirty`` when tracked files differ from it, ``unknown``
outside a git checkout. Call it when a run *starts*: a commit made while a long run is going must not
get the credit for its numbers.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent


def git_commit() -> str:
    """``<sha>``, ``<sha>+dirty`` or ``unknown``."""
    try:
        head = subprocess.run(["git", "-C", str(_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(_ROOT), "status", "--porcelain", "--untracked-files=no", "--", "dlb"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head + ("+dirty" if dirty else "")) if head else "unknown"


def code_tree() -> str:
    """The git tree id of ``dlb/`` at HEAD (``<tree>``), ``<tree>+dirty`` or ``unknown``.

    Two commits with the same tree ran the same code: a long protocol run resumed after a commit that
    touched only docs or tests is still one build's numbers (``dlb sim --resume``, ``dlb sim report``).
    A dirty tree has no id that names its code, so nothing resumes onto it.
    """
    try:
        tree = subprocess.run(["git", "-C", str(_ROOT), "rev-parse", "HEAD:dlb"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = git_commit()
    if not tree or commit == "unknown":
        return "unknown"
    return tree + ("+dirty" if commit.endswith("+dirty") else "")
