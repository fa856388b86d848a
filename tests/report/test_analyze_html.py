"""``sidecar analyze PATH --html FILE``: the report written beside the text report, the trace linked."""

from __future__ import annotations

import subprocess
import sys

from .hostile import write_trace
from .markup_check import parse


def _analyze(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sidecar.cli", "analyze", *args], capture_output=True, text=True,
                          timeout=120)


def test_analyze_writes_the_html_report(tmp_path):
    trace = write_trace(tmp_path / "trace.json")
    out = tmp_path / "out" / "report.html"
    done = _analyze(str(trace), "--html", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Trace: ")  # the text report is still printed
    assert f"report written to {out}" in done.stderr
    page = out.read_text(encoding="utf-8")
    parse(page)
    assert 'href="../trace.json"' in page and "<script" not in page


def test_an_unwritable_report_is_an_error_after_the_summary(tmp_path):
    trace = write_trace(tmp_path / "trace.json")
    (tmp_path / "file").write_text("")
    done = _analyze(str(trace), "--json", "--html", str(tmp_path / "file" / "report.html"))
    assert done.returncode == 1 and "cannot write" in done.stderr
