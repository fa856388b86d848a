"""What scripts/flake-hunt.sh prints at the end: every test that failed or errored in any of the runs, how
many runs it failed in, and its first failure message. Exit 1 when there is any. A run is a folder of
JUnit files (scripts/run-tests.sh writes one per part) or one JUnit file."""

from __future__ import annotations

import sys
from pathlib import Path
import xml.etree.ElementTree as ET
from collections import defaultdict


def failures(path: str) -> dict[str, str]:
    """test id -> first line of its failure message, for one run's JUnit XML."""
    found = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            test = f"{case.get('classname', '')}::{case.get('name', '')}"
            found[test] = (problem.get("message") or problem.text or "").strip().splitlines()[0][:300] \
                if (problem.get("message") or problem.text) else "(no message)"
    return found


def run_failures(path: str) -> dict[str, str]:
    """The failures of one run: its JUnit file, or those of every JUnit file in its folder."""
    run = Path(path)
    if not run.is_dir():
        return failures(path)
    files = sorted(run.glob("*.xml"))
    if not files:
        raise OSError(f"no JUnit file in {run}")
    found: dict[str, str] = {}
    for file in files:
        found |= failures(str(file))
    return found


def main(paths: list[str]) -> int:
    if not paths:
        print("flake_report: no JUnit files given", file=sys.stderr)
        return 2
    seen: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for run, path in enumerate(paths, 1):
        try:
            found = run_failures(path)
        except (OSError, ET.ParseError) as exc:
            print(f"run {run}: no results ({path}: {exc}): the run itself failed, see its log", file=sys.stderr)
            seen["<the run itself>"].append((run, str(exc)))
            continue
        for test, message in found.items():
            seen[test].append((run, message))
    if not seen:
        print(f"flake-hunt: no test failed in {len(paths)} runs")
        return 0
    print(f"flake-hunt: {len(seen)} tests failed in some of {len(paths)} runs")
    for test, where in sorted(seen.items(), key=lambda item: -len(item[1])):
        runs = ", ".join(str(run) for run, _ in where)
        print(f"  {test}\n    failed in {len(where)} of {len(paths)} (runs {runs}): {where[0][1]}")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
