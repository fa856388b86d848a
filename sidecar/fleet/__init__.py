"""Many sidecars at once, with no engine and no aiohttp: where they are, how to reach each, and how
their answers compare. ``sidecar fleet`` (sidecar/cli/fleet.py) is the command; docs/fleet.md.

    targets     a sidecar's URL as given or found, the list and file forms, the tokens file
    prometheus  the active targets of a Prometheus scrape job
    k8s         the pods of a Kubernetes label selector (the official client)
    fanout      one call per target on a bounded pool, each a result or a one-line error, progress
    compare     per replica its figures, the median and the outlier
    page        the comparison as one HTML page in the report's style
"""
