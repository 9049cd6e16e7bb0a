"""``python -m dlb``: the same command as the ``dlb`` script (for a venv whose bin is not on PATH)."""

from __future__ import annotations

import sys

from dlb.cli import main

if __name__ == "__main__":
    sys.exit(main())
