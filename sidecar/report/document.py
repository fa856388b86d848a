"""The HTML document every page is: one file, its style and script inline, a Content-Security-Policy
that allows exactly those two (by hash) and images from ``data:`` only. The policy is in the document
itself, so it holds for a report opened from a file as well as one served by the sidecar; with it,
even markup that escaped ``esc`` could not run a script.
"""

from __future__ import annotations

from .markup import attributes, esc, tag
from .script import SCRIPT, SCRIPT_HASH, STYLE_HASH
from .styles import CSS


def policy(interactive: bool) -> str:
    """The page's CSP. ``interactive``: the page script may run and call this origin's API."""
    script = f"script-src {SCRIPT_HASH}; connect-src 'self'" if interactive else "script-src 'none'"
    return (f"default-src 'none'; {script}; style-src {STYLE_HASH}; img-src data:; "
            "form-action 'self'; base-uri 'none'")


def page(title: str, body: str, *, subtitle: str = "", interactive: bool = True, **body_attrs: object) -> str:
    """A whole document. ``body`` is markup; ``title`` and ``subtitle`` are text."""
    script = f"<script>{SCRIPT}</script>" if interactive else ""
    header = tag("header", tag("h1", esc(title)) + (tag("p", esc(subtitle)) if subtitle else ""))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{esc(policy(interactive))}\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        "<meta name=\"referrer\" content=\"no-referrer\">"
        # An icon of its own: no request for /favicon.ico (a 404 in the console, a request off the page).
        "<link rel=\"icon\" href=\"data:,\">"
        f"<title>{esc(title)}</title><style>{CSS}</style>{script}</head>"
        f"<body{attributes(body_attrs)}>{header}<main>{body}</main></body></html>\n"
    )


def token_prompt(what: str, *, download: bool = False) -> str:
    """What a browser gets instead of a page when the sidecar has a token and the request none: a form
    that asks for it (nothing of the page itself). The script keeps the token in this tab's
    sessionStorage, fetches the page with it and shows it. ``download``: the flight recorder's file
    instead of a page (``data-download``): the script fetches this URL as JSON with the token and saves
    the answer as a file, saying so (or the sidecar's error) beside the form."""
    verb, button = ("download", "Download") if download else ("open", "Open")
    form = (
        "<form id=\"token-form\" class=\"start\" autocomplete=\"off\">"
        "<label for=\"token\">Token</label>"
        "<input id=\"token\" name=\"token\" type=\"password\" required autocomplete=\"off\">"
        f"<button type=\"submit\" class=\"wide\">{button}</button><output class=\"wide\"></output></form>"
    )
    body = tag("section", tag("p", f"This sidecar has a token: enter it to {verb} {esc(what)}. "
                                   "It is kept in this browser tab only (sessionStorage), sent in the "
                                   "<code>Authorization</code> header, never in a URL.") + form)
    return page("inference-sidecar: token needed", body, data_locked=True, data_download=download)


def message_page(title: str, message: str) -> str:
    """A short page for a browser: no such capture, not finished yet. ``message`` is text."""
    return page(title, tag("section", tag("p", esc(message)) + tag("p", tag("a", "Home", href="/"))))
