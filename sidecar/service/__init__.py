"""The sidecar process (``sidecar serve``): the HTTP API beside an engine (docs/api.md).

The shell, here (with routes/, the only code of the service that imports aiohttp):

    app            ``make_app``: the app assembled, its middleware (auth, every error as JSON), ``/healthz``
    browser_guard  the first middleware: cross-site and rebinding requests refused (403 / 421)
    openapi        ``GET /openapi.json``, built from the routes and the parser's constants
    serving        ``sidecar serve``'s runner: every answer in JSON, HTTP parser errors included
    tracing        the sidecar's own spans to OTLP when ``OTEL_*`` names a backend

Its folders, lowest first (an import only goes down):

    export/     a finished capture made into files: the merge, the merged trace and its summary
    metrics/    /metrics: the pushed OTLP series, their Prometheus translation, the sidecar's own
    channel/    the probe channel's sidecar half: registry, clock sync, file fetch, queries
    jobs/       the one job life cycle and its kinds: captures, scans, module timings, request captures
    incidents/  the flight recorder's view, dumps and clock; triggers
    pages/      the home page and its start forms (HTML)
    routes/     every aiohttp handler of the API and the probe websocket, and the app's keys
"""
