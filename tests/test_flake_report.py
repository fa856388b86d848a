"""scripts/flake_report.py, what scripts/flake-hunt.sh prints at the end: a run is the folder of its parts'
JUnit files (scripts/run-tests.sh writes main.xml and side.xml), and a test failed in it where either
part says so."""

import subprocess
import sys
from pathlib import Path

REPORT = Path(__file__).resolve().parent.parent / "scripts" / "flake_report.py"


def junit(path: Path, **cases: str | None) -> None:
    """A JUnit file of ``cases``: test name -> failure message, or None where it passed."""
    rows = "".join(f'<testcase classname="tests.test_x" name="{name}">'
                   + (f'<failure message="{message}">trace</failure>' if message else "") + "</testcase>"
                   for name, message in cases.items())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'<testsuites><testsuite name="pytest">{rows}</testsuite></testsuites>')


def report(*runs: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPORT), *map(str, runs)], capture_output=True, text=True)


def test_a_failure_in_either_part_of_a_run_is_reported_with_its_runs(tmp_path):
    junit(tmp_path / "run-1" / "main.xml", test_a=None, test_b=None)
    junit(tmp_path / "run-1" / "side.xml", test_c="assert 1 == 2")
    junit(tmp_path / "run-2" / "main.xml", test_a="timed out waiting", test_b=None)
    junit(tmp_path / "run-2" / "side.xml", test_c="assert 1 == 3")
    done = report(tmp_path / "run-1", tmp_path / "run-2")
    assert done.returncode == 1, done
    assert "2 tests failed in some of 2 runs" in done.stdout
    assert "tests.test_x::test_c\n    failed in 2 of 2 (runs 1, 2): assert 1 == 2" in done.stdout
    assert "tests.test_x::test_a\n    failed in 1 of 2 (runs 2): timed out waiting" in done.stdout
    assert "test_b" not in done.stdout


def test_runs_that_all_passed_exit_zero_and_a_run_without_results_is_a_failure(tmp_path):
    junit(tmp_path / "run-1" / "main.xml", test_a=None)
    junit(tmp_path / "run-1" / "side.xml", test_b=None)
    passed = report(tmp_path / "run-1")
    assert passed.returncode == 0 and "no test failed in 1 runs" in passed.stdout, passed
    (tmp_path / "run-2").mkdir()
    empty = report(tmp_path / "run-1", tmp_path / "run-2")
    assert empty.returncode == 1 and "<the run itself>" in empty.stdout, empty
    assert "run 2: no results" in empty.stderr
