"""Every aiohttp handler of the HTTP API and the probe websocket, and the app's keys. The only
package besides the shell (sidecar.service) that imports aiohttp.

    keys           the application's state, one typed ``AppKey`` each
    settings       ``ServiceSettings``: the ``sidecar serve`` flags
    responses      JSON errors, and the parameters of a start request
    request_body   a start request's body, read strictly
    jobs           ``JobRoutes``: the start, stop, status and list routes of every job kind
    captures       ``/profile/*`` and ``/profiles``; a capture's downloads
    diff           ``GET /profile/{a}/diff/{b}``
    scans          ``/sync/*``, ``/syncs`` and ``/syncs/watch``
    modules        ``/modules/*`` and ``/modules``
    memory         ``/memory/*`` and ``/memory``; a process's raw snapshot, the summary's page
    incidents      ``/recorder``, ``/stacks`` and ``/requests``
    timeline       ``/recorder/timeline``: the home page's chart of the last minutes
    triggers       ``/triggers``
    alerts         ``/alerts``: Alertmanager's webhook, and what came of it
    pages          ``GET /`` and ``GET /profile/{id}/report``; the page a browser gets for a 401
    metrics        ``POST /v1/metrics`` (signed pushes) and ``GET /metrics``
    probe_channel  the probe websocket (handshake, typed frames) and ``GET /processes``
"""
