"""One markdown table of `dlb bench faults` JSON files: a row per fault, a column per policy.

Each cell: failed (min/median/max over the runs), lost (failures other than streams already answering),
`recover_s` (min/median/max; "none" = not back within the run) and the runs that passed the bench's rule.
Later files override earlier ones for the same (fault, policy), so a re-run of a row can be given last.

    python research/bench/faults_matrix.py research/bench/faults-quiet/Disc-Grad-matrix-13.json ...
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from dlb.bench.faults import ANSWERING


def _three(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "none"
    if len(known) < len(values):
        return f"{min(known):g}/…/none"
    return f"{min(known):g}/{statistics.median(known):g}/{max(known):g}"


def cell(run_rows: list[dict[str, Any]]) -> str:
    failed = [r["failed"] for r in run_rows]
    lost = [r["failed"] - sum(n for code, n in r["failure_codes"].items() if code in ANSWERING) for r in run_rows]
    passed = sum(r["verdict"] == "pass" for r in run_rows)
    return (f"{_three(failed)} · lost {_three(lost)} · rec {_three([r['recover_s'] for r in run_rows])} · "
            f"{passed}/{len(run_rows)}")


def table(paths: list[Path]) -> str:
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
    faults: list[str] = []
    policies: list[str] = []
    for path in paths:
        for row in json.loads(path.read_text(encoding="utf-8"))["rows"]:
            key = (row["fault"], row["policy"])
            cells[key] = row["run_rows"]
            faults += [row["fault"]] * (row["fault"] not in faults)
            policies += [row["policy"]] * (row["policy"] not in policies)
    lines = ["| fault | " + " | ".join(policies) + " |", "| --- |" + " --- |" * len(policies)]
    for f in faults:
        lines.append(f"| {f} | " + " | ".join(cell(cells[(f, p)]) if (f, p) in cells else "—" for p in policies) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", type=Path)
    print(table(p.parse_args().files))


if __name__ == "__main__":
    main()
