"""``dlb theory`` with the gradient cost's utilisation cap changed for this run only.

Usage: python research/tools/theory_grad_cap.py 0.995 --sizes 10,12 --graphs complete --load 0.85,0.95
--policies Flow-Grad --replicas 1 --noise 0 --jobs 1 --json OUT (the arguments after the cap go to
``dlb theory``; ``--jobs 1`` so the patched constant is the one that runs).
"""

from __future__ import annotations

import sys

from dlb.cli import main
from dlb.core import latency_model
from dlb.core import router as core_router

if __name__ == "__main__":
    cap = float(sys.argv[1])
    latency_model.GRAD_MAX_RHO = cap
    core_router.GRAD_MAX_RHO = cap  # imported by name there (the per-request scalar cost)
    sys.exit(main(["theory", *sys.argv[2:]]))
