"""Shared fixtures: where the recorded traces are, and independent plain-JSON counts of them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from sidecar.analysis import analyze_path

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
TRACE_NAMES = sorted(p.name for p in TRACES.glob("*.json.gz")) if TRACES.is_dir() else []


def trace_path(name: str) -> Path:
    if not TRACES.is_dir():
        pytest.skip(f"recorded traces not found at {TRACES} (the shared/ folder beside the repository)")
    path = TRACES / name
    if not path.is_file():
        pytest.skip(f"{path} is missing from the shared traces")
    return path


def load_plain(path: Path) -> dict:
    """The whole trace with the standard library: the reference the streaming reader must match."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


_SUMMARIES: dict[str, dict] = {}


@pytest.fixture
def summary_of():
    """analyze_path with a per-session cache: several tests look at the same trace."""

    def get(name: str, top_n: int = 100_000) -> dict:
        key = f"{name}:{top_n}"
        if key not in _SUMMARIES:
            _SUMMARIES[key] = analyze_path(trace_path(name), top_n=top_n)
        return _SUMMARIES[key]

    return get
