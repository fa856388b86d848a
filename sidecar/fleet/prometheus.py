"""The sidecars a Prometheus scrapes: the active targets of one scrape job (``GET /api/v1/targets``).

Prometheus already knows every sidecar, whatever found it (static lists, file or Kubernetes service
discovery): the scheme, host and port of each target's scrape URL is the sidecar. A ``port`` given
replaces the scrape URL's, for a job that scrapes something beside the sidecar on the same host.
A target Prometheus itself finds down is still listed: the fleet command reaches it, or names why not.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

from .targets import Target, TargetError, base_url, unique

MAX_ANSWER_BYTES = 64 << 20  # the targets of every job of a large Prometheus; more is not an answer to read


def job_targets(prometheus_url: str, job: str, *, timeout: float = 10.0, port: int | None = None,
                opener: urllib.request.OpenerDirector | None = None) -> list[Target]:
    """The job's active targets as sidecars, each named by its ``instance`` label; ``TargetError``
    when Prometheus cannot be asked, or lists none for ``job``."""
    base = prometheus_url.rstrip("/")
    url = f"{base}/api/v1/targets?" + urllib.parse.urlencode({"state": "active"})
    try:
        with (opener or urllib.request.build_opener()).open(url, timeout=timeout) as resp:
            body = resp.read(MAX_ANSWER_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise TargetError(f"Prometheus at {base} answered HTTP {exc.code} for /api/v1/targets") from None
    except (urllib.error.URLError, OSError) as exc:
        raise TargetError(f"cannot reach Prometheus at {base}: {getattr(exc, 'reason', None) or exc}") from None
    if len(body) > MAX_ANSWER_BYTES:
        raise TargetError(f"Prometheus at {base}: the targets answer is over {MAX_ANSWER_BYTES >> 20} MiB")
    try:
        active = json.loads(body)["data"]["activeTargets"]
    except (ValueError, KeyError, TypeError):
        raise TargetError(f"Prometheus at {base}: /api/v1/targets is not a Prometheus targets answer") from None
    found, jobs = [], set()
    for t in active:
        labels = t.get("labels") or {}
        jobs.add(labels.get("job") or t.get("scrapePool"))
        if labels.get("job") != job and t.get("scrapePool") != job:
            continue
        scrape_url = t.get("scrapeUrl") or ""
        sidecar = base_url(scrape_url)
        if port is not None:
            sidecar = base_url(f"{sidecar.rsplit(':', 1)[0]}:{port}")
        found.append(Target(sidecar, labels.get("instance") or ""))
    if not found:
        known = ", ".join(sorted(j for j in jobs if j)) or "none"
        raise TargetError(f"Prometheus at {base} has no active target of job {job!r} (its jobs: {known})")
    return unique(found)
