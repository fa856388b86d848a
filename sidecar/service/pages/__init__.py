"""The sidecar's own pages, HTML drawn from the service's state (no aiohttp; routes/pages.py serves them).

    home   ``GET /``: what is connected, captured, scanned and timed; the triggers; the start forms
    forms  the start forms, one field per parameter, from the parser's own definitions (jobs/params.py)
"""
