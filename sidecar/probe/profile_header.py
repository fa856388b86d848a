"""Which requests ask to be captured: the ``X-Sidecar-Profile`` header, or W3C baggage ``sidecar.profile``.

A client asks for a request-scoped capture with ``X-Sidecar-Profile: 1``, or, through a tracing
system that propagates baggage, with ``baggage: sidecar.profile=1``. Accepted values are the
project's booleans (``config.parse_bool``): ``1``/``true``/``yes``/``on`` ask, ``0``/``false``/``no``/
``off`` or an empty value do not, in any case, with spaces around ignored. The header decides when
it is present with a boolean value; the baggage entry only when it is not.

Headers come from clients: nothing here may raise or slow the request down. Any other value (``banana``)
asks for nothing and is reported as the request's problem (its span says so), never as an error of the
request; a baggage header is read only up to ``MAX_BAGGAGE_CHARS`` (the W3C limit), and its problems
are not logged (a client could fill the log with them). The OpenTelemetry baggage propagator is not
used for that reason: it logs every malformed header in full.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable
from urllib.parse import unquote

from ..common import config

HEADER = "x-sidecar-profile"
BAGGAGE_HEADER = "baggage"
BAGGAGE_KEY = "sidecar.profile"
MAX_BAGGAGE_CHARS = 8192  # W3C Baggage: a platform must propagate at least 8192 bytes
MAX_SHOWN = 40  # characters of a bad value quoted back in the problem
NOT_BOOLEAN = "is not 1/0, true/false, yes/no or on/off: the request is served uncaptured"


@dataclass(frozen=True)
class ProfileAsk:
    """What a request's headers say: capture it (``asked``), or why its ask was not understood."""

    asked: bool
    problem: str | None = None  # a value that is not a boolean: the request is served uncaptured


NOT_ASKED = ProfileAsk(False)


def read_profile_ask(headers: Any) -> ProfileAsk:
    """The ask in ``headers`` (a mapping with case-insensitive keys, such as Starlette's ``Headers``,
    or a plain dict with lower-case keys). Never raises."""
    try:
        header = _first(headers, HEADER)
        if header is not None and _boolean(header) is not None:  # the header decides
            return ProfileAsk(_boolean(header))
        baggage = _baggage_value(headers)
        if baggage is not None and _boolean(baggage) is not None:
            return ProfileAsk(_boolean(baggage))
        if header is not None:
            return ProfileAsk(False, f"X-Sidecar-Profile: {_shown(header)} {NOT_BOOLEAN}")
        if baggage is not None:
            return ProfileAsk(False, f"baggage {BAGGAGE_KEY}={_shown(baggage)} {NOT_BOOLEAN}")
        return NOT_ASKED
    except Exception:  # a header object of an unexpected kind: ask for nothing
        return NOT_ASKED


def _first(headers: Any, name: str) -> str | None:
    value = headers.get(name)
    return value if isinstance(value, str) else None


def _all(headers: Any, name: str) -> Iterable[str]:
    getlist = getattr(headers, "getlist", None)
    values = getlist(name) if callable(getlist) else [headers.get(name)]
    return [v for v in values if isinstance(v, str)]


def _boolean(value: str) -> bool | None:
    try:
        return config.parse_bool(value, HEADER)
    except ValueError:
        return None


def _baggage_value(headers: Any) -> str | None:
    """The value of ``sidecar.profile`` in the request's baggage (every ``baggage`` header, joined as
    HTTP joins repeated headers), percent-decoded; None when it has none."""
    text = ",".join(_all(headers, BAGGAGE_HEADER))[:MAX_BAGGAGE_CHARS]
    for member in text.split(","):
        pair = member.split(";", 1)[0]  # ";" starts the member's properties
        key, sep, value = pair.partition("=")
        if sep and key.strip() == BAGGAGE_KEY:
            return unquote(value.strip())
    return None


def _shown(value: str) -> str:
    text = "".join(c if c.isprintable() else "?" for c in value[:MAX_SHOWN])
    return repr(text + ("…" if len(value) > MAX_SHOWN else ""))
