"""The report model: one JSON-ready dict per sync site, baseline comparison, and merging of the
reports of several processes.

A site (``sites`` list of a report):
  file, path, line, function   the code that caused the sync (absolute / import-relative path)
  op                           item, bool, float, int, tolist, numpy, cpu, to_cpu, copy_to_host,
                               copy_to_pageable_non_blocking, nonzero, masked_select, unique,
                               unique_consecutive, boolean_mask_index, repeat_interleave,
                               synchronize, event.synchronize, stream.synchronize
  phase                        forward, sampling, scheduling, other
  count, count_per_step        calls seen; calls per recorded step
  blocked_us                   host time spent inside those calls
  first_step, last_step        0-based indices of the recorded steps it was seen in
  classification, reason       expected (allowlisted, with the entry's reason) or hidden
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from .allowlist import HIDDEN, Allowlist

if TYPE_CHECKING:  # the detector imports torch; merging reports in the sidecar must not
    from .detector import SiteStats

SITE_KEY = ("path", "function", "op")
# Times summed when sites merge, where a site has them (watch sites have neither; trace sites both).
SUMMED_TIMES = ("blocked_us", "gpu_idle_after_us")


def build_sites(stats: Iterable[SiteStats], steps: int, allowlist: Allowlist) -> list[dict[str, Any]]:
    sites = []
    for s in stats:
        site = {
            "file": s.site.file,
            "path": s.site.path,
            "line": s.site.line,
            "function": s.site.function,
            "op": s.op,
            "phase": s.site.phase,
            "count": s.count,
            "count_per_step": round(s.count / steps, 3) if steps else float(s.count),
            "blocked_us": round(s.blocked_ns / 1000.0, 1),
            "first_step": s.first_step,
            "last_step": s.last_step,
        }
        site["classification"], site["reason"] = allowlist.classify(site)
        sites.append(site)
    return sort_sites(sites)


def sort_sites(sites: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Hidden first, then the costliest."""
    return sorted(sites, key=lambda s: (s["classification"] != HIDDEN, -s["blocked_us"], s["path"], s["line"], s["op"]))


def site_key(site: Mapping[str, Any], match_line: bool = True) -> tuple:
    key = tuple(site[k] for k in SITE_KEY)
    return key + (site["line"],) if match_line else key


def new_sites(sites: Sequence[Mapping[str, Any]], baseline: Sequence[Mapping[str, Any]] | Mapping[str, Any], match_line: bool = True) -> list[dict[str, Any]]:
    """The sites of a scan that a saved baseline (a report, or its ``sites`` list) does not have.
    Sites are compared by import-relative path, function and op, and by line unless
    ``match_line=False`` (code above the site moved)."""
    base_sites = baseline.get("sites", []) if isinstance(baseline, Mapping) else baseline
    known = {site_key(s, match_line) for s in base_sites}
    return [dict(s) for s in sites if site_key(s, match_line) not in known]


def merge_reports(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One report from the reports of several processes (each a ``sync`` message, optionally with a
    ``process`` label). Sites with the same path, line, function and op are summed;
    ``count_per_step`` adds up the per-process rates (syncs per engine step across all processes)."""
    steps = [r.get("steps_recorded", 0) for r in reports]
    return {
        "type": "sync",
        "scan_id": next((r.get("scan_id") for r in reports if r.get("scan_id")), None),
        "steps_recorded": min(steps) if steps else 0,
        "processes": len(reports),
        "sites": sort_sites(merge_sites(reports, lambda r: r.get("process") or r.get("pid"))),
    }


def merge_watch_reports(reports: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The sites of several processes' watch reports (watch.py, each with a ``process`` label),
    merged as in ``merge_reports``; hidden first, then the most frequent (watch sites have no
    ``blocked_us``)."""
    merged = merge_sites(reports, lambda r: r.get("process"))
    return sorted(merged, key=lambda s: (s["classification"] != HIDDEN, -s["count"], s["path"], s["line"]))


def merge_sites(reports: Sequence[Mapping[str, Any]], label_of: Callable[[Mapping[str, Any]], Any]) -> list[dict[str, Any]]:
    """The one merge of sites over reports (live scans, the watch, the processes of a trace), in
    order of first appearance, unsorted. Sites with the same path, line, function and op (and
    ``api``, which only trace sites have: one line can make two different calls) are summed: counts
    and, where present, host time blocked and GPU idle time after added, per-process rates added,
    the step range widened (a trace site outside every ProfilerStep has step -1: none), hidden if any
    report classed it hidden; ``processes`` lists the labels (``label_of(report)``, None for none) of
    the reports that saw it."""
    merged: dict[tuple, dict[str, Any]] = {}
    for report in reports:
        label = label_of(report)
        for site in report.get("sites", []):
            key = site_key(site) + (site.get("api"),)
            into = merged.get(key)
            if into is None:
                into = merged[key] = {**site, "processes": []}
            else:
                into["count"] += site["count"]
                into["count_per_step"] = round(into["count_per_step"] + site["count_per_step"], 3)
                for field in SUMMED_TIMES:
                    if field in into:
                        into[field] = round(into[field] + site[field], 1)
                into["first_step"] = _earliest(into["first_step"], site["first_step"])
                into["last_step"] = max(into["last_step"], site["last_step"])
                if site["classification"] == HIDDEN:
                    into["classification"], into["reason"] = HIDDEN, ""
            if label is not None and label not in into["processes"]:
                into["processes"].append(label)
    return list(merged.values())


def _earliest(a: int, b: int) -> int:
    """The earlier of two first steps, where -1 means none."""
    return min(a, b) if a >= 0 and b >= 0 else max(a, b)
