"""compare_results.py DIR_A DIR_B: whether each experiment's results.json (utilization, length, noise) is the same
in both, every field but the timing and provenance ones (wall_s, cpu_s, commit, code, piece_started_at, finished_at)."""
import json
import sys
from pathlib import Path

VOLATILE = {"wall_s", "cpu_s", "commit", "code", "piece_started_at", "finished_at"}


def strip(x: object) -> object:
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items() if k not in VOLATILE}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x


def main() -> int:
    ok = True
    for e in ("utilization", "length", "noise"):
        a, b = (json.loads((Path(d) / e / "results.json").read_text()) for d in sys.argv[1:3])
        same = json.dumps(strip(a), sort_keys=True) == json.dumps(strip(b), sort_keys=True)
        print(e, "IDENTICAL" if same else "DIFFERENT", "records", len(a))
        ok &= same
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
