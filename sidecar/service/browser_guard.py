"""What a web page in the user's browser must not do to the sidecar: drive it or read it.

The sidecar's default set-up (loopback, no token) trusts whoever can connect. A browser on the same
host can connect too, on behalf of any page it opens, so two attacks reach a loopback sidecar
(docs/security.md, "A web page in the user's browser"):

- **Cross-site requests.** A page on another site makes the browser send a request (an ``<img>``, an
  auto-submitted form, a ``no-cors`` fetch, a redirect). The page cannot read the answer, but a request
  that starts a capture has done its harm by arriving. Refused here, for every request that changes
  state: an ``Origin`` that is not the sidecar's own, ``Sec-Fetch-Site`` other than ``same-origin`` or
  ``none``, a ``Referer`` from another origin where the browser sent neither of those, and a body type
  a page can send without a CORS preflight (form, multipart, text/plain). ``/stacks`` and ``/recorder``
  count as acting: they make the engine work (except a link to ``/recorder`` on a sidecar with a
  token: it gets the token prompt, and the engine works only after the user's click there). Every
  other request that a browser marks as another site's is refused too unless it is a top-level
  navigation (a link from Grafana to a capture's report still opens).
- **DNS rebinding.** A page re-points its own host name at 127.0.0.1 and then reads the sidecar as
  "same origin". Its requests still name the page's host in ``Host``, so a ``Host`` that is neither a
  loopback name, an IP address, nor a name given with ``--allowed-host`` is refused (421) before any
  handler runs. A sidecar that has a token skips this check: the token is what a rebinding page lacks,
  and a scraper, health check or client reaching it through a Service name must not be locked out.

Clients that are not browsers (curl, the CLI, Prometheus, the probes) send none of these headers and
are unaffected. The probe channel and the signed metric push prove the token with an HMAC instead of
presenting it, so the ``Host`` check leaves them out; the cross-site checks still apply (a browser's
websocket names its page in ``Origin``). No CORS header is ever sent, so no other origin reads an answer.
"""

from __future__ import annotations

from typing import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import hdrs, web

from ..common import config
from ..common.protocol import METRICS_PUSH_PATH, PROBE_WS_PATH
from .routes.keys import SETTINGS
from .routes.responses import json_error

# A GET to these starts a job: state changes on them whatever the method (the other starts and stops,
# the trigger routes, and every future route that changes state take POST or DELETE).
START_PATHS = frozenset({"/profile/start", "/sync/start", "/modules/start", "/memory/start"})
# Reads that make the engine work (a stack sampler for up to a minute, py-spy pausing it, a recorder
# dump of tens of MiB): a cross-site navigation must not set them off either.
COSTLY_READS = frozenset({"/stacks", "/recorder"})
# Costly reads a link from another site may still open where the sidecar has a token: what it opens is
# the token prompt, whose own fetch (same-origin, after a click) makes the engine work.
PROMPTED_DOWNLOADS = frozenset({"/recorder"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# What a page may send cross-site without a CORS preflight ("simple" requests, Fetch standard):
# a state-changing request must arrive as something else (query parameters, or a JSON body).
SIMPLE_BODY_TYPES = frozenset({"application/x-www-form-urlencoded", "multipart/form-data", "text/plain"})
# Paths that authenticate with an HMAC proof of the token rather than the token itself.
HMAC_PATHS = frozenset({PROBE_WS_PATH, METRICS_PUSH_PATH})
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
# A cross-site navigation may open a read in a tab; framed or embedded it is a page's subresource.
TOP_LEVEL_DESTS = frozenset({"document", ""})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _route_path(request: web.Request) -> str:
    """The path of the route that serves ``request`` (its canonical form), or the request's own."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else request.path


def changes_state(request: web.Request) -> bool:
    """Whether ``request`` would act (start or stop a job, add or delete a trigger, open the probe channel)
    or make the engine work (``COSTLY_READS``)."""
    path = _route_path(request)
    upgrade = request.headers.get(hdrs.UPGRADE, "").lower() == "websocket"
    return request.method not in SAFE_METHODS or path in START_PATHS or path in COSTLY_READS or upgrade


def split_host(value: str) -> tuple[str, str | None]:
    """``Host`` (or an ``Origin``'s netloc) as a lower-case name without a trailing dot, and its port."""
    value = value.strip().lower()
    if value.startswith("["):  # [v6]:port
        name, closed, rest = value[1:].partition("]")
        if not closed or (rest and not rest.startswith(":")):  # "[::1", "[::1]evil": no host at all
            return value, None
        return name, rest[1:] if rest else None
    if value.count(":") == 1:
        name, _, port = value.partition(":")
        return name.rstrip("."), port
    return value.rstrip("."), None


def host_allowed(host: str, allowed: tuple[str, ...]) -> bool:
    """A ``Host`` a rebinding page cannot send: a loopback name, an IP address (a page whose origin is an
    address is that address's own), or a name given with ``--allowed-host`` (on any port: a rebinding
    page reaches the sidecar on the sidecar's own port anyway, so a port would protect nothing)."""
    name, _ = split_host(host)
    return name in LOOPBACK_NAMES or config.is_ip_address(name) or name in allowed


def _same_origin(origin: str, host: str) -> bool:
    """Whether an ``Origin`` (or a ``Referer``) names the origin the browser reached the sidecar at."""
    try:
        parts = urlsplit(origin)
        netloc = parts.netloc
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not netloc:
        return False
    name, port = split_host(netloc)
    own_name, own_port = split_host(host)
    default = "443" if parts.scheme == "https" else "80"
    return name == own_name and (port or default) == (own_port or default)


def cross_site_problem(request: web.Request) -> str | None:
    """Why ``request`` looks sent by a browser on behalf of another site (None: it does not)."""
    headers = request.headers
    host = headers.get(hdrs.HOST, "")
    site = headers.get("Sec-Fetch-Site", "").lower()
    origin = headers.get(hdrs.ORIGIN)
    if not changes_state(request):
        # A read: only a top-level navigation may come from another site (the page never sees the answer).
        navigation = headers.get("Sec-Fetch-Mode", "").lower() == "navigate" and \
            headers.get("Sec-Fetch-Dest", "").lower() in TOP_LEVEL_DESTS
        if site in ("cross-site", "same-site") and not navigation:
            return f"Sec-Fetch-Site is {site!r} and this is no top-level navigation: another site's page asked"
        return None
    if origin is not None and not _same_origin(origin, host):
        return f"the Origin {origin!r} is not the sidecar's own (http://{host})"
    if site and site not in ("same-origin", "none"):
        return f"Sec-Fetch-Site is {site!r}: a page on another site (or a link or redirect from one) sent it"
    referer = headers.get(hdrs.REFERER)
    if origin is None and not site and referer and not _same_origin(referer, host):
        return "the Referer names another origin"
    return None


def body_type_problem(request: web.Request) -> str | None:
    """A state-changing request whose body type any page may send cross-site without asking first."""
    if hdrs.CONTENT_TYPE in request.headers and request.content_type in SIMPLE_BODY_TYPES:
        return (f"a body of type {request.content_type} is what a page on any site can make a browser send; "
                "give the parameters in the query string or as a JSON object (Content-Type: application/json)")
    return None


def _prompted_download(request: web.Request, token: str | None) -> bool:
    """A link followed from another site (Grafana's trace view) to a recorder download, on a sidecar with
    a token: a navigation carries no token, so the auth check answers it with the token prompt and the
    engine does nothing; the download itself is the prompt's same-origin fetch after the user's click."""
    headers = request.headers
    return (bool(token) and request.method in ("GET", "HEAD") and _route_path(request) in PROMPTED_DOWNLOADS
            and hdrs.AUTHORIZATION not in headers and "text/html" in headers.get(hdrs.ACCEPT, "")
            and headers.get("Sec-Fetch-Mode", "").lower() == "navigate"
            and headers.get("Sec-Fetch-Dest", "").lower() in TOP_LEVEL_DESTS)


@web.middleware
async def browser_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuses, before any handler runs, what a page in the user's browser must not do (module docstring)."""
    settings = request.app[SETTINGS]
    host = request.headers.get(hdrs.HOST)
    # With a token the token is the check: a rebinding page has none, and a name not listed (a Service,
    # a node's name) must not lock out /healthz, the token prompt or a scraper with a wrong token (401).
    if host is not None and not settings.http_token and _route_path(request) not in HMAC_PATHS \
            and not host_allowed(host, settings.allowed_hosts):
        return json_error(421, "host_not_allowed",
                          f"the Host {host!r} is not a name this sidecar serves (a page that rebinds its own name "
                          "to this address sends that); use localhost or an IP address, or start the sidecar with "
                          "--allowed-host NAME", host=host)
    problem = cross_site_problem(request)
    if problem is None and changes_state(request):
        problem = body_type_problem(request)
    if problem is not None and _prompted_download(request, settings.http_token):
        problem = None  # the token check answers it with the prompt: no engine work (module docstring)
    if problem is not None:
        return json_error(403, "cross_site_request", f"refused: {problem}")
    return await handler(request)
