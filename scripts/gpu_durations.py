"""Per-test durations for longest-first GPU test runs (tests/_timebox.py, SPECDEC_TEST_ORDER).

Reads the JSON-lines reports the time-boxed GPU runs write (`gpu_props.sh`: props_<part>.jsonl,
one line per test call with its seconds) and writes tests/gpu_durations.json: every call of at
least --min-seconds, the longest seen in any report. Refresh it after a GPU run:

    python scripts/gpu_durations.py notes/gpu/issue19/props_*_<hash>.jsonl [older reports ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "gpu_durations.json"


def current_nodeid(nodeid: str) -> str:
    """A report's nodeid with its file at today's path: reports written before the test files moved
    into folders named after the package they test (tests/test_x.py -> tests/<package>/test_x.py)
    name the old path; basenames are unique, so the file is found by name. Others stay as they are."""
    path, sep, rest = nodeid.partition("::")
    if path.startswith("tests/test_") and "/" not in path[len("tests/"):] and not (ROOT / path).exists():
        found = sorted((ROOT / "tests").rglob(Path(path).name))
        if len(found) == 1:
            return str(found[0].relative_to(ROOT)) + sep + rest
    return nodeid


def read_durations(paths: list[Path], min_seconds: float) -> dict[str, float]:
    """{nodeid: seconds}: each test call's longest duration over `paths`, if >= min_seconds."""
    seconds: dict[str, float] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("when") == "call" and row["seconds"] >= min_seconds:
                nodeid = current_nodeid(row["nodeid"])
                seconds[nodeid] = max(seconds.get(nodeid, 0.0), float(row["seconds"]))
    return dict(sorted(seconds.items(), key=lambda kv: -kv[1]))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reports", nargs="+", type=Path, help="props_<part>.jsonl reports of GPU runs")
    p.add_argument("--min-seconds", type=float, default=1.0, help="calls shorter than this are left out (default 1)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    if args.min_seconds < 0:
        p.error(f"--min-seconds={args.min_seconds} must be >= 0")
    seconds = read_durations(args.reports, args.min_seconds)
    doc = {"from": sorted(r.name for r in args.reports), "seconds": seconds}
    args.out.write_text(json.dumps(doc, indent=0) + "\n")
    print(f"{len(seconds)} tests, {sum(seconds.values()):.0f} s of calls -> {args.out}")


if __name__ == "__main__":
    main()
