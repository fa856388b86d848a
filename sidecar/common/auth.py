"""The shared secret between the sidecar, its HTTP clients and the probes.

The HTTP API takes the token itself (``Authorization: Bearer``). The probe channel and the metric
push never send it: each side proves it knows the token with an HMAC-SHA256 keyed by it, over inputs
that the other side chose (a nonce) or that cannot be reused (a timestamp and the body's digest).
Every input is ASCII text joined by NUL bytes behind a label naming its use, so that no proof made
for one use is valid for another (docs/api.md, "Probe authentication"; docs/security.md):

  sidecar → probe   HMAC(token, "sidecar" NUL probe_nonce NUL sidecar_nonce)
  probe → sidecar   HMAC(token, "probe" NUL sidecar_nonce NUL probe_nonce)
  metric push       HMAC(token, "metrics" NUL timestamp NUL hex(sha256(body)))

Nonces are 32 random bytes as 64 lowercase hex characters, a timestamp is decimal unix seconds,
every MAC is lowercase hex.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import secrets
import stat
import tempfile
from pathlib import Path

from . import config

# A token is a secret only if it cannot be guessed: the sidecar's own are 43 characters
# (secrets.token_urlsafe(32)); one given by hand must have at least this many. It travels in an HTTP
# header and is read back from a file stripped, so only visible ASCII, no spaces.
MIN_TOKEN_CHARS = 16
_VISIBLE_ASCII = re.compile(r"[!-~]+")


def token_problem(token: str) -> str | None:
    """Why ``token`` cannot be the shared secret (None: it can)."""
    if len(token) < MIN_TOKEN_CHARS:
        return f"a token must have at least {MIN_TOKEN_CHARS} characters, this one has {len(token)}"
    if not _VISIBLE_ASCII.fullmatch(token):
        return "a token must be visible ASCII characters only (no spaces): it is sent in an HTTP header"
    return None


def read_token() -> str | None:
    """The token a probe presents: $SIDECAR_TOKEN, else the token file the sidecar wrote."""
    value = os.environ.get(config.ENV_TOKEN, "").strip()
    if value:
        return value
    try:
        return config.token_file().read_text().strip() or None
    except OSError:
        return None


def ensure_token_file(path: Path, token: str | None) -> str:
    """Make sure ``path`` holds the sidecar's token (creating a random one if none is given).

    An existing file is reused so that a restarted sidecar keeps the secret its probes already know;
    one that holds no valid token (written by hand, or by a version that took any) raises ValueError
    rather than being replaced behind the user's back or kept as a weak secret.

    The folder must be one no other user can write to (``token_folder_problem``; ValueError otherwise):
    whoever can write there can put a token of their own in place for the sidecar to adopt and the
    probes to prove, or links where the file is written. The file is written whole through a temporary
    of a fresh name (``mkstemp``: created, never opened through an existing name or link), then renamed
    over ``path``; a rename replaces a link at ``path`` rather than following it.
    """
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    problem = token_folder_problem(folder)
    if problem:
        raise ValueError(f"the token folder {folder} {problem}; or set ${config.ENV_TOKEN_FILE} to a file "
                         "in a folder of your own that only you can write to")
    if token is None:
        try:
            existing = path.read_text().strip()
        except OSError:
            existing = ""
        problem = token_problem(existing) if existing else None
        if problem:
            raise ValueError(f"the token file {path} holds no usable token ({problem}): "
                             "delete it for a new random one, or write a longer one")
        token = existing or secrets.token_urlsafe(32)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")  # mode 0600
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(token)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return token


def token_folder_problem(folder: Path) -> str | None:
    """Why another user could tamper with a token file in ``folder`` (None: nobody but its owner can).

    The folder must belong to this user or to root (root can do anything anyway) and give nobody else
    write access: not even a sticky folder such as /tmp, where another user can create the token's
    name before the sidecar does. Its permissions are not changed here: a folder the user made
    shared is theirs to fix, once they know."""
    info = folder.stat()
    if info.st_uid not in (os.geteuid(), 0):
        return (f"belongs to another user (uid {info.st_uid}), who could replace the token: use a folder "
                "of your own")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"can be written by other users (mode {stat.S_IMODE(info.st_mode):04o}), who could plant "
                f"a token or a link there: make it private (chmod 700 {folder})")
    return None


def bearer_matches(header: str | None, token: str) -> bool:
    """``Authorization: Bearer <token>``; the scheme name is case-insensitive (RFC 7235 2.1)."""
    parts = (header or "").split(None, 1)
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return False
    given = parts[1].strip()
    # A token is ASCII (token_problem); a header's other bytes arrive as surrogates, which encode() refuses.
    return given.isascii() and hmac.compare_digest(given.encode(), token.encode())


# -- proofs of the token, for the probe channel and the metric push ---------------------------------------
SIDECAR_LABEL = b"sidecar"
PROBE_LABEL = b"probe"
METRICS_LABEL = b"metrics"
NONCE_BYTES = 32
HEX64 = r"^[0-9a-f]{64}$"  # a nonce, a proof, a signature
TIMESTAMP_HEADER = "X-Sidecar-Timestamp"
SIGNATURE_HEADER = "X-Sidecar-Signature"
PUSH_MAX_SKEW_S = 60  # a signed push older or newer than this is refused


def new_nonce() -> str:
    return secrets.token_hex(NONCE_BYTES)


def mac(token: str, label: bytes, first: str, second: str) -> str:
    """HMAC-SHA256(token, label + NUL + first + NUL + second), lowercase hex."""
    message = label + b"\0" + first.encode("ascii") + b"\0" + second.encode("ascii")
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def _same(given: str, expected: str) -> bool:
    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())


def sidecar_proof(token: str, probe_nonce: str, sidecar_nonce: str) -> str:
    """What the sidecar sends in its ``Challenge``: it knows the token."""
    return mac(token, SIDECAR_LABEL, probe_nonce, sidecar_nonce)


def sidecar_proof_ok(token: str, probe_nonce: str, sidecar_nonce: str, proof: str) -> bool:
    return _same(proof, sidecar_proof(token, probe_nonce, sidecar_nonce))


def probe_proof(token: str, sidecar_nonce: str, probe_nonce: str) -> str:
    """What the probe answers in its ``Proof``, once the sidecar's proof checked out."""
    return mac(token, PROBE_LABEL, sidecar_nonce, probe_nonce)


def probe_proof_ok(token: str, sidecar_nonce: str, probe_nonce: str, proof: str) -> bool:
    return _same(proof, probe_proof(token, sidecar_nonce, probe_nonce))


def push_signature(token: str, timestamp: str, body: bytes) -> str:
    return mac(token, METRICS_LABEL, timestamp, hashlib.sha256(body).hexdigest())


def push_headers(token: str, body: bytes, now: float) -> dict[str, str]:
    """The headers that sign one metric push."""
    timestamp = str(int(now))
    return {TIMESTAMP_HEADER: timestamp, SIGNATURE_HEADER: push_signature(token, timestamp, body)}


def push_header_problem(timestamp: str | None, signature: str | None, now: float) -> str | None:
    """What is wrong with a push's signing headers before the body is read (None: nothing yet)."""
    if not timestamp or not signature:
        return f"a signed push needs {TIMESTAMP_HEADER} and {SIGNATURE_HEADER}"
    if not re.fullmatch(r"[0-9]{1,12}", timestamp):
        return f"{TIMESTAMP_HEADER} must be unix seconds"
    if abs(now - int(timestamp)) > PUSH_MAX_SKEW_S:
        return f"{TIMESTAMP_HEADER} is more than {PUSH_MAX_SKEW_S} s from the sidecar's clock"
    if not re.fullmatch(HEX64, signature):
        return f"{SIGNATURE_HEADER} must be 64 hex digits"
    return None


def push_signature_problem(token: str, timestamp: str | None, signature: str | None, body: bytes,
                           now: float) -> str | None:
    """Why a push is refused (None: its signature is valid)."""
    problem = push_header_problem(timestamp, signature, now)
    if problem is None and not _same(signature, push_signature(token, timestamp, body)):
        problem = "the signature does not match"
    return problem
