"""Environment variables and defaults, one constant each.

Constructor arguments and CLI flags override the environment; a bad environment value is logged and
replaced by the default (it must never stop an engine from starting), a bad argument raises.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
from pathlib import Path
from typing import Mapping

log = logging.getLogger(__name__)

DEFAULT_PORT = 8787
DEFAULT_HOST = "127.0.0.1"

# Where probes find the sidecar. Default: the sidecar's default address on this host.
ENV_ENDPOINT = "SIDECAR_ENDPOINT"
DEFAULT_ENDPOINT = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"

# Shared secret for the HTTP API and the probe channel. When unset the sidecar creates one in
# ENV_TOKEN_FILE (mode 0600), which probes of the same user read: the probe channel is always
# authenticated, and plain `curl` on loopback still works without a token.
ENV_TOKEN = "SIDECAR_TOKEN"
ENV_TOKEN_FILE = "SIDECAR_TOKEN_FILE"

# Set to 1 to load the engine plugin without patching anything (baseline runs, emergencies).
ENV_DISABLE = "SIDECAR_DISABLE"

# The probes' trace root: they write raw traces only under <root>/captures/<id>/raw/, never where a
# message says. Default: beside the default token file (trace_dir()). `sidecar serve` takes it as
# its default --trace-dir, so that sidecar and engine share one root when it is set.
ENV_TRACE_DIR = "SIDECAR_TRACE_DIR"
# The engine instance of this process (processes of one instance count the same working steps). An
# engine plugin sets it in a server's first process, which its engine processes inherit; set it
# yourself to group processes otherwise.
ENV_INSTANCE = "SIDECAR_INSTANCE"
# Set to 1 to have the sidecar fetch this process's files over the probe channel even where it could
# read them (it does so anyway where it cannot: another host or container, detected by a marker file).
ENV_PROBE_SEND_FILES = "SIDECAR_PROBE_SEND_FILES"

# Upper bounds that keep a capture's output finite. The sidecar's flags can lower or raise them.
DEFAULT_MAX_STEPS = 1000
DEFAULT_MAX_CAPTURE_MB = 1024
DEFAULT_KEEP_CAPTURES = 20
# Retention by size: the newest finished captures are kept while their folders total at most this
# much (the newest one always stays, whatever its size: --max-capture-mb bounds it).
DEFAULT_KEEP_MB = 4096
# Below this much free space on the trace dir a capture is refused (HTTP 507).
DEFAULT_MIN_FREE_MB = 64
DEFAULT_CAPTURE_TIMEOUT_S = 120.0
MAX_CAPTURE_TIMEOUT_S = 3600.0

# The probes' own limits, whatever the sidecar asks (sidecar.probe.capture.limits): steps per job, seconds
# one window may record, MiB of one trace file.
ENV_PROBE_MAX_STEPS = "SIDECAR_PROBE_MAX_STEPS"  # default DEFAULT_MAX_STEPS
ENV_PROBE_MAX_CAPTURE_S = "SIDECAR_PROBE_MAX_CAPTURE_S"
DEFAULT_PROBE_MAX_CAPTURE_S = 300.0
ENV_PROBE_MAX_TRACE_MB = "SIDECAR_PROBE_MAX_TRACE_MB"  # default DEFAULT_MAX_CAPTURE_MB


# The flight recorder (sidecar.probe.flight_ring): how many recent steps each step-driven process keeps,
# always on (0: none). 65536 steps hold 10 minutes at about 100 steps/s.
ENV_RECORDER_STEPS = "SIDECAR_RECORDER_STEPS"
# The step watchdog (sidecar.probe.watchdog): a step running longer than this many seconds has the
# process's stacks dumped once and is reported stuck. Unset or 0: off.
ENV_WATCHDOG_S = "SIDECAR_WATCHDOG_S"

def _private_base() -> Path:
    """$XDG_RUNTIME_DIR/inference-sidecar, else ~/.cache/inference-sidecar: the token file's folder."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime else Path.home() / ".cache"
    return base / "inference-sidecar"


def default_token_file() -> Path:
    return _private_base() / "token"


def trace_dir() -> Path:
    """The trace root: $SIDECAR_TRACE_DIR, else ``traces`` beside the default token file."""
    value = os.environ.get(ENV_TRACE_DIR, "").strip()
    return Path(value) if value else _private_base() / "traces"


def token_file() -> Path:
    value = os.environ.get(ENV_TOKEN_FILE)
    return Path(value) if value else default_token_file()


def is_ip_address(text: str) -> bool:
    """Whether ``text`` is an IPv4 or IPv6 address (not a host name)."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a ``--host`` value, a URL's host name) is this machine's loopback: ``localhost``
    or a loopback address. Other names under ``.localhost`` are not counted: not every resolver maps
    them to loopback."""
    host = host.strip("[]").lower().rstrip(".")  # a URL's [::1], a fully qualified "localhost."
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is 127.0.0.1
    return address.is_loopback or bool(mapped and mapped.is_loopback)


def reaches_this_machine(host: str) -> bool:
    """Whether a URL's ``host`` is this machine without leaving it: loopback, or 0.0.0.0 / :: as a
    destination (what the start line of ``sidecar serve --host 0.0.0.0`` prints, and users copy). A
    client sends such a request directly, never through a proxy (it would carry the token there)."""
    if is_loopback_host(host):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def endpoint() -> str:
    value = os.environ.get(ENV_ENDPOINT, "").strip()
    if not value:
        return DEFAULT_ENDPOINT
    if not value.startswith(("http://", "https://")):
        log.warning("%s=%r is not an http(s) URL; using %s", ENV_ENDPOINT, value, DEFAULT_ENDPOINT)
        return DEFAULT_ENDPOINT
    return value.rstrip("/")


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off", "")


def parse_bool(raw: str, name: str) -> bool:
    """The one reading of a boolean setting (environment variable, query parameter, flag).
    Raises ValueError naming ``name`` for anything but 1/0, true/false, yes/no, on/off (any case)."""
    value = raw.strip().lower()
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    raise ValueError(f"{name}={raw!r} is not a boolean; use 1/0, true/false, yes/no or on/off")


def env_flag(name: str, default: bool = False, env: Mapping[str, str] | None = None) -> bool:
    """A boolean environment variable. A bad value is logged as an error naming the variable and the
    default is used: a typo must never stop an engine from starting."""
    raw = (os.environ if env is None else env).get(name)
    if raw is None or not raw.strip():
        return default
    try:
        return parse_bool(raw, name)
    except ValueError as exc:
        log.error("inference-sidecar: %s; using %s", exc, "1" if default else "0")
        return default


def env_number(name: str, default: float, *, integer: bool = False,
               env: Mapping[str, str] | None = None) -> float:
    """A positive, finite number from the environment (an integer if ``integer``). A bad value is
    logged as an error naming the variable and the default is used, as for ``env_flag``."""
    raw = (os.environ if env is None else env).get(name)
    if raw is None or not raw.strip():
        return default
    text = raw.strip()
    # ASCII digits only: int() and float() also take "1_0" and other scripts' digits.
    pattern = r"[0-9]+" if integer else r"[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?"
    value = (int(text) if integer else float(text)) if re.fullmatch(pattern, text) else 0
    if not 0 < value < float("inf"):
        kind = "a positive integer" if integer else "a positive number"
        log.error("inference-sidecar: %s=%r is not %s; using %s", name, raw, kind, default)
        return default
    return value


def disabled() -> bool:
    return env_flag(ENV_DISABLE)
