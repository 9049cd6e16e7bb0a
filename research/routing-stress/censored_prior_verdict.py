"""The measured prior with the running requests: the verdict of research/routing-stress/censored-prior-rule.md.

Each experiment is an (off, on) pair of ``dlb sim`` output folders: off ran main before the change with Rand,
the operator baselines and the four policies that fit latency models; on ran the change with the four. Per
(variant, policy), every figure the mean over its scenarios, every cell is a no-harm cell: on's mean ≤ 1.01 ×
off's and on's failures ≤ off's + 0.05 point. The issue's R, O and F are printed for both arms.

Usage: python research/routing-stress/censored_prior_verdict.py NAME OFF ON [...] [--json FILE]
"""

from __future__ import annotations

import admission_floor_verdict  # the same table and verdict, with every cell a no-harm cell

MODEL_POLICIES = ("Disc-Lat", "Disc-Grad", "Flow-Lat", "Flow-Grad")

if __name__ == "__main__":
    admission_floor_verdict.main(__doc__, MODEL_POLICIES, (), ("adopted", "not adopted"))
