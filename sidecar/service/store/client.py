"""The store opened from its URL with obstore, which speaks S3, GCS, Azure and a local folder alike.

Credentials come from the library's standard chain for each cloud (environment, shared files,
instance or workload identity): the sidecar never reads, holds or logs them. For S3 the endpoint is
the standard ``AWS_ENDPOINT_URL`` where set (any S3-compatible store); an ``http://`` one is allowed
explicitly, since the library refuses plain HTTP otherwise.

The library's own retries are kept short (``RETRY``): the uploader (uploads.py) does the long
retrying itself, so that an upload's state says "retrying" while the store is down instead of one
call hanging for minutes.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from typing import Any

SCHEMES = ("s3", "gs", "az", "file")
ENDPOINT_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT")
# One call to the store: a short in-library retry of a dropped connection, then our backoff.
RETRY = {"max_retries": 2, "retry_timeout": timedelta(seconds=20),
         "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=2), "base": 2}}
CLIENT = {"connect_timeout": "5s", "timeout": "120s"}


def url_problem(url: str) -> str | None:
    """What is wrong with a ``--store`` URL, or None."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SCHEMES:
        return f"must be one of {', '.join(s + '://' for s in SCHEMES)} followed by a bucket (or a folder), got {url!r}"
    if scheme == "file":
        return None if rest.startswith("/") else "file:// needs an absolute path (file:///shared/volume)"
    if not rest.split("/", 1)[0]:
        return f"names no bucket: {scheme}://BUCKET/prefix"
    return None


def open_store(url: str) -> Any:
    """The obstore store for ``url``, its path the prefix every key is under. Raises ValueError (a URL
    or configuration the library refuses) naming the problem, never a credential."""
    from obstore.store import from_url

    problem = url_problem(url)
    if problem:
        raise ValueError(problem)
    try:
        if url.startswith("file://"):
            return from_url(url, mkdir=True)
        options: dict[str, Any] = dict(CLIENT)
        endpoint = next((os.environ[k] for k in ENDPOINT_ENV if os.environ.get(k)), "")
        if url.startswith("s3://") and endpoint.startswith("http://"):
            options["allow_http"] = True
        return from_url(url, client_options=options, retry_config=RETRY)
    except Exception as exc:  # obstore's configuration errors: a bad URL, an unknown key
        raise ValueError(f"the store cannot be opened: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}") from None


def permanent(exc: BaseException) -> bool:
    """Whether retrying ``exc`` cannot help: refused credentials or permissions, a bucket or
    container that does not exist, a key the store refuses. A dropped connection, a time-out, a 5xx
    and anything else are worth a retry."""
    from obstore import exceptions as e

    return isinstance(exc, (e.PermissionDeniedError, e.UnauthenticatedError, e.NotFoundError, e.InvalidPathError,
                            e.NotSupportedError, e.UnknownConfigurationKeyError, e.PreconditionError))


_QUERY = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^\s?\"'<>]+)\?[^\s\"'<>]*")
_CODE = re.compile(r"<Code>([^<]{1,100})</Code>")
_MESSAGE = re.compile(r"<Message>([^<]{1,300})</Message>")


def describe(exc: BaseException) -> str:
    """One line for ``stored.error`` and the log: the error's kind, the store's own error code and
    message where it sent them (S3's ``<Code>``: ``InvalidAccessKeyId``, ``NoSuchBucket``), and the
    library's first line (the key and the status), bounded. Never a secret: a URL's query is cut."""
    # A URL's query is cut: an Azure SAS token or a presigned signature travels there.
    text = _QUERY.sub(r"\1?…", str(exc))
    first = (text.strip().splitlines() or [""])[0]
    first = re.split(r":? *<(?:\?xml|Error>|Code>)", first, maxsplit=1)[0][:300]
    code, message = _CODE.search(text), _MESSAGE.search(text)
    said = f" [{code.group(1)}{': ' + message.group(1) if message else ''}]" if code else ""
    return f"{type(exc).__name__}{said}: {first}"[:600]
