"""Object storage (``sidecar serve --store URL``): finished results kept in S3, GCS, Azure or a shared
volume as well as on the local disk, so that a rescheduled pod does not take them with it
(docs/fleet.md, "Object storage"). No aiohttp: the library (obstore) has its own client.

    layout    the keys, named once: where a capture, a fleet's capture, a scan, a module timing, a recorder dump go
    client    the store opened from its URL (credentials from the standard chain); which errors are worth a retry
    uploads   the bounded queue and its worker: retries with backoff, the oldest waiting dropped when full
    counters  the uploads' own metrics in /metrics
    reader    the store read back: its captures listed, a capture's file fetched on demand
"""
