"""The store's keys, named once: every writer and reader of the store asks this module.

Under the store URL's prefix (``s3://bucket/prefix``):

- ``captures/<capture id>/``: a capture's files (merged trace, per-process traces, summary) and its
  ``capture.json``, written last: a capture folder without one is an upload that did not finish
- ``fleets/<fleet>/<instance>/<capture id>/``: the same, for a capture started with ``fleet=`` (one
  fleet capture's replicas side by side; ``<instance>`` names the sidecar: ``--store-instance``, by
  default the host name, in Kubernetes the pod's)
- ``scans/<scan id>.json``, ``modules/<module timing id>.json``: their one result file
- ``recorder/<instance>/<file>``: a trigger's flight-recorder dump
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

CAPTURE_JSON = "capture.json"
CAPTURES = "captures"
FLEETS = "fleets"
# A fleet id and an instance name are one path segment each: a short id, nothing a key could escape with.
FLEET_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NOT_IN_INSTANCE = re.compile(r"[^A-Za-z0-9_.-]")


def instance_name(text: str) -> str:
    """``text`` (a host or pod name) as one key segment: other characters become ``_``, at most 64,
    never empty nor a dot segment."""
    name = _NOT_IN_INSTANCE.sub("_", text)[:64].strip(".")
    return name or "sidecar"


def redacted(url: str) -> str:
    """The store URL as logged and shown: scheme, bucket and prefix; never a user, password or query
    (where a SAS token or key could sit)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


class StoreLayout:
    """The keys under the store's prefix (relative to it: the store object applies the prefix), and
    the full URL of each for people (``stored.url``)."""

    def __init__(self, url: str, instance: str) -> None:
        self.url = redacted(url).rstrip("/")
        self.instance = instance_name(instance)

    def capture_prefix(self, capture_id: str, fleet: str | None = None) -> str:
        if fleet:
            return f"{FLEETS}/{fleet}/{self.instance}/{capture_id}/"
        return f"{CAPTURES}/{capture_id}/"

    def scan_key(self, scan_id: str) -> str:
        return f"scans/{scan_id}.json"

    def module_key(self, job_id: str) -> str:
        return f"modules/{job_id}.json"

    def recorder_key(self, file_name: str) -> str:
        return f"recorder/{self.instance}/{file_name}"

    def full_url(self, key: str) -> str:
        return f"{self.url}/{key}"


def capture_of(key: str, is_id) -> tuple[str, str] | None:
    """(capture id, its prefix) for the key of a capture's ``capture.json`` in either place; None for
    any other key (``is_id``: the capture id's own check)."""
    parts = key.split("/")
    if not parts or parts[-1] != CAPTURE_JSON:
        return None
    if len(parts) == 3 and parts[0] == CAPTURES:
        capture_id = parts[1]
    elif len(parts) == 5 and parts[0] == FLEETS and FLEET_ID.fullmatch(parts[1]):
        capture_id = parts[3]
    else:
        return None
    return (capture_id, key[: -len(CAPTURE_JSON)]) if is_id(capture_id) else None
