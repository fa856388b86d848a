"""The summary is JSON-ready, has the fields the sidecar relies on, and every field it emits is
documented in docs/analysis.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sidecar.analysis import SCHEMA_VERSION, format_report

from .conftest import TRACE_NAMES

DOCS = Path(__file__).resolve().parents[2] / "docs" / "analysis.md"
pytestmark = pytest.mark.skipif(not TRACE_NAMES, reason="recorded traces not found (../shared/traces)")


def _keys(value, found: set[str]) -> set[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            found.add(key)
            _keys(item, found)
    elif isinstance(value, list):
        for item in value:
            _keys(item, found)
    return found


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_summary_is_strict_json(name, summary_of):
    summary = summary_of(name, top_n=10)
    assert json.loads(json.dumps(summary, allow_nan=False)) == summary
    assert summary["schema_version"] == SCHEMA_VERSION == 1
    for key in ("kernel_time_us", "busy_us", "busy_fraction", "top_kernels"):
        assert key in summary["gpu"]
    for kernel in summary["gpu"]["top_kernels"]:
        assert {"name", "count", "total_us"} <= set(kernel)
    for sync in summary["syncs"]:
        assert {"name", "count", "total_us"} <= set(sync)
    for step in summary["steps"]:
        assert {"process", "step", "wall_us"} <= set(step) and isinstance(step["step"], int)
    assert summary["processes"] and all("steps" in p and "gpu" in p and "cpu" in p for p in summary["processes"])
    assert isinstance(summary["headline"], str) and summary["headline"]


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_report_renders(name, summary_of):
    text = format_report(summary_of(name, top_n=10))
    assert text.startswith("Trace: ") and summary_of(name, top_n=10)["headline"] in text


def test_every_field_is_documented(summary_of):
    documented = set(re.findall(r"`([a-z_A-Z]+)`", DOCS.read_text(encoding="utf-8")))
    emitted: set[str] = set()
    for name in TRACE_NAMES:
        _keys(summary_of(name, top_n=10), emitted)
    emitted -= {"HtoD", "DtoH", "DtoD", "HtoH", "PtoP", "Memset", "other"}  # memcpy directions: documented as a list
    missing = sorted(emitted - documented)
    assert not missing, f"fields missing from docs/analysis.md: {missing}"
