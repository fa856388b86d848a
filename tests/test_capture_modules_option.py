"""``with_modules`` (issue 13 part 3) as a capture parameter: parsed strictly, carried to the probes'
``CaptureSpec`` over the channel's own encoding, and kept in a capture's record across restarts."""

from pathlib import Path

import pytest

from sidecar.common.protocol import Arm
from sidecar.common.protocol_codec import decode_from_sidecar, encode
from sidecar.service.jobs.capture_index import _request
from sidecar.service.jobs.captures import Capture
from sidecar.service.jobs.params import ParamError, parse_capture_request


def parse(**params):
    return parse_capture_request({k: str(v) for k, v in params.items()}, max_steps=100)


def test_with_modules_is_off_unless_asked_and_reaches_the_probe_spec():
    assert parse(steps=3).with_modules is False
    request = parse(steps=3, with_modules="true")
    assert request.with_modules is True
    capture = Capture(id="20260101-000000-abcdef", request=request, processes=[], dir=Path("/nonexistent"))
    spec = decode_from_sidecar(encode(Arm(spec=capture.spec()))).spec
    assert spec.with_modules is True and spec.stacks == "none"


@pytest.mark.parametrize("raw", ["maybe", "2", "truee"])
def test_a_value_that_is_no_boolean_is_a_400_naming_it(raw):
    with pytest.raises(ParamError) as info:
        parse(steps=3, with_modules=raw)
    assert info.value.param == "with_modules" and raw in info.value.message


def test_the_option_survives_a_restart_of_the_sidecar():
    request = _request({"steps": 3}, {"with_modules": True, "processes": "all"})
    assert request.with_modules is True
    assert _request({"steps": 3}, {}).with_modules is False
