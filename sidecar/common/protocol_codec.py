"""A probe channel frame to and from its typed message (sidecar/common/protocol.py), and the protocol version.

Each message is a JSON object whose ``type`` tag names its struct. ``encode`` writes one;
``decode_from_probe`` / ``decode_from_sidecar`` decode and validate a frame in one call and raise
``ProtocolError`` (naming the problem) for anything malformed, so a receiver never half-applies a
message. The first frame of a connection is the probe's ``Hello`` (``decode_hello``): its version is
read before anything else, so a probe speaking another ``PROTOCOL_VERSION`` is refused with an error
naming both versions (``ProtocolVersionError``), not a field-level complaint.

A change to the messages that a peer of the previous version would misread or silently drop needs a
new ``PROTOCOL_VERSION``, and a paragraph below saying why.

Still version 10 (issue 30): the sidecar's ``step_alarm`` and ``hello.step_alarm``. The sidecar sends
the frame only to a probe whose hello says ``step_alarm``, so a probe that does not know it never
receives it; a sidecar that does not know it ignores that field of the hello (a struct's unknown
fields are skipped) and never sends the frame, and its probe sends its heartbeats every 2 s as
before. Either way nothing is misread or lost: a rule fires at the next heartbeat, as it did. Also
``verdict.started_by`` (the alert or trigger that started a capture): an older probe skips the unknown
field, and its capture span just lacks those names.

Version 10 (issue 14): a marker's name (``hello.marker``) says its pid space, ``<pid>-<random>-<pid
space>-<host>`` (sidecar/probe/capture/marker.py), so a probe clears by their dead pid only the markers of its
own host and pid namespace, never a live one of another container sharing the volume. A version-9
sidecar would refuse the new name as a malformed hello, not name both versions, hence the new version.

Version 9 (issue 13): the module-timing job (``module_arm``, ``modules``) and the capture spec's
``with_modules``: an older probe would drop the one and ignore the other silently (the job would only
time out), hence the new version.

Version 8 (issue 14): clock probes (``clock``, ``clock_reply``): the sidecar aligns each process's
trace on its own clock where a process's clock is measurably off (another host). Files over the
channel (``hello.files_at``/``marker``, ``fetch``, ``file_chunk``): a probe that does not share the
sidecar's file system (another host or container) has its files fetched, in chunks the sidecar
asks for one at a time (its own back-pressure), checked by size and SHA-256.

Version 7: request-scoped captures (issue 11): ``CaptureSpec.request_id``, ``request_capture``,
``request_capture_answer``, ``request_capture_release``.

Version 6: queries (flight recorder, stacks, requests in flight) and the heartbeat's step age,
watchdog and in-flight fields (issue 11).

Version 5: a probe no longer adds its sampled stacks to its trace nor summarises them; it reports
its samples file (``stacks_file``) and the sidecar does both. A version-4 sidecar would ignore that
field and lose the stacks silently, hence the new version.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .protocol import FromProbe, FromSidecar, Hello

PROTOCOL_VERSION = 10


class ProtocolError(ValueError):
    """A frame that is not a valid message of this protocol version."""


class ProtocolVersionError(ProtocolError):
    def __init__(self, theirs: Any, ours: int = PROTOCOL_VERSION) -> None:
        # Short enough to fit a websocket close frame (123 bytes) whole.
        super().__init__(f"probe speaks protocol {theirs!r}, sidecar speaks {ours}: "
                         "install one inference-sidecar version on both sides")


class _VersionOnly(msgspec.Struct):
    type: Any = None
    protocol: Any = None


_encoder = msgspec.json.Encoder()
_from_probe = msgspec.json.Decoder(FromProbe)
_from_sidecar = msgspec.json.Decoder(FromSidecar)
_version_only = msgspec.json.Decoder(_VersionOnly)
_hello = msgspec.json.Decoder(Hello)


def encode(msg: FromProbe | FromSidecar) -> str:
    return _encoder.encode(msg).decode()


def _decode(decoder: msgspec.json.Decoder, frame: str | bytes) -> Any:
    try:
        return decoder.decode(frame)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ProtocolError(str(exc)) from None
    except RecursionError:  # a field of any type holding JSON nested deeper than the decoder goes
        raise ProtocolError("JSON nested too deep") from None


def decode_from_probe(frame: str | bytes) -> FromProbe:
    return _decode(_from_probe, frame)


def decode_from_sidecar(frame: str | bytes) -> FromSidecar:
    return _decode(_from_sidecar, frame)


def decode_hello(frame: str | bytes) -> Hello:
    """The first frame of a connection. The version is checked before anything else, so a probe of
    another version gets an error naming both versions, not a field-level complaint."""
    head = _decode(_version_only, frame)
    if head.type != "hello":
        raise ProtocolError(f"the first message must be 'hello', got {head.type!r}")
    if head.protocol != PROTOCOL_VERSION:
        raise ProtocolVersionError(head.protocol)
    return _decode(_hello, frame)
