"""Rewrite the relative Markdown links of a file moved from one folder to another so they still resolve.

Why: docs moved to research/ (and sections cut from docs into research notes) keep working links.
Usage: ``python research/tools/relink.py OLD_DIR FILE...`` (FILE already at its new place).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

LINK = re.compile(r"(\[[^\]]*\]\()([^)\s]+)(\))")


def relink(text: str, old_dir: Path, new_dir: Path) -> str:
    """``text`` with each relative link re-based from ``old_dir`` to ``new_dir``."""

    def fix(m: re.Match[str]) -> str:
        target = m.group(2)
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            return m.group(0)
        path, _, anchor = target.partition("#")
        moved = os.path.relpath((old_dir / path).resolve(), new_dir.resolve())
        return m.group(1) + moved + ("#" + anchor if anchor else "") + m.group(3)

    return LINK.sub(fix, text)


def main(argv: list[str]) -> int:
    old_dir = Path(argv[0])
    for name in argv[1:]:
        f = Path(name)
        f.write_text(relink(f.read_text(encoding="utf-8"), old_dir, f.parent), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
