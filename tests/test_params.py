import pytest

from sidecar.service.jobs.params import ParamError, ProcessSelector, parse_capture_request, parse_scan_request


def parse(**params):
    return parse_capture_request({k: str(v) for k, v in params.items()}, max_steps=100)


@pytest.mark.parametrize(
    "params, param",
    [
        ({}, "steps"),
        ({"steps": 0}, "steps"),
        ({"steps": -3}, "steps"),
        ({"steps": "abc"}, "steps"),
        ({"steps": 1000000000}, "steps"),
        ({"steps": "2.5"}, "steps"),
        ({"steps": 5, "activities": "tpu"}, "activities"),
        ({"steps": 5, "activities": ","}, "activities"),
        ({"steps": 5, "delay": -1}, "delay"),
        ({"steps": 5, "record_shapes": "maybe"}, "record_shapes"),
        ({"steps": 5, "processes": "gpu"}, "processes"),
        ({"steps": 5, "processes": "worker:x"}, "processes"),
        ({"steps": 5, "timeout_s": "0"}, "timeout_s"),
        ({"steps": 5, "timeout_s": "nan"}, "timeout_s"),
        ({"steps": 5, "timeout_s": "inf"}, "timeout_s"),
        ({"steps": 5, "stepz": 3}, "stepz"),
    ],
)
def test_bad_parameters_name_the_parameter(params, param):
    with pytest.raises(ParamError) as info:
        parse(**params)
    assert info.value.param == param
    body = info.value.to_json()
    assert body["param"] == param and body["error"] == "bad_parameter" and body["message"]


def test_good_parameters_are_parsed():
    req = parse(steps=5, activities="CPU,cuda,cpu", delay=2, with_stack="true", record_shapes="0",
                processes="worker:1,engine-core", timeout_s="2.5")
    assert req.steps == 5 and req.delay == 2
    assert req.activities == ("cpu", "cuda")
    assert req.with_stack is True and req.record_shapes is False
    assert req.processes == (ProcessSelector("worker", 1), ProcessSelector("engine_core"))
    assert req.timeout_s == 2.5
    assert req.selects("worker", 1) and req.selects("engine_core", None)
    assert not req.selects("worker", 0) and not req.selects("api_server", None)


@pytest.mark.parametrize("params, stacks, hz", [
    ({"with_stack": "1"}, "sampled", 1000.0),  # the older spelling asks for the cheap mode
    ({"with_stack": "0"}, "none", 1000.0),
    ({"stacks": "Traced"}, "traced", 1000.0),
    ({"stacks": "sampled", "stack_hz": "250"}, "sampled", 250.0),
    ({"stacks": "sampled", "with_stack": "true"}, "sampled", 1000.0),
    ({"stacks": "none", "with_stack": "false"}, "none", 1000.0),
])
def test_stack_modes(params, stacks, hz):
    req = parse(steps=1, **params)
    assert (req.stacks, req.stack_hz, req.with_stack) == (stacks, hz, stacks != "none")


@pytest.mark.parametrize("params, name", [
    ({"stacks": "all"}, "stacks"),
    ({"stacks": "none", "with_stack": "1"}, "with_stack"),
    ({"stacks": "sampled", "with_stack": "0"}, "with_stack"),
    ({"stack_hz": "100"}, "stack_hz"),  # without stacks it means nothing
    ({"stacks": "sampled", "stack_hz": "0"}, "stack_hz"),
    ({"stacks": "sampled", "stack_hz": "5001"}, "stack_hz"),
    ({"stacks": "sampled", "stack_hz": "nan"}, "stack_hz"),
    ({"stacks": "sampled", "stack_hz": "fast"}, "stack_hz"),
])
def test_bad_stack_options_name_the_parameter(params, name):
    with pytest.raises(ParamError) as info:
        parse(steps=1, **params)
    assert info.value.param == name


def test_defaults_select_everything():
    req = parse(steps=1)
    assert req.activities == () and req.delay == 0 and not req.with_stack
    assert req.selects("api_server", None) and req.selects("worker", 7)


def test_roles_of_connected_processes_are_accepted_and_unknown_ones_listed():
    req = parse_capture_request({"steps": "1", "processes": "scheduler:0"}, max_steps=10, connected_roles=["scheduler"])
    assert req.processes == (ProcessSelector("scheduler", 0),)
    with pytest.raises(ParamError) as info:
        parse_capture_request({"steps": "1", "processes": "scheduler"}, max_steps=10)
    assert info.value.param == "processes"
    assert "'scheduler'; use api_server, engine_core, worker (optionally role:rank)" in info.value.message


@pytest.mark.parametrize("raw, value", [("yes", True), ("ON", True), (" 1 ", True), ("off", False), ("", False),
                                        ("No", False)])
def test_boolean_options_take_the_one_set_of_words(raw, value):
    assert parse(steps=1, with_flops=raw).with_flops is value


def test_scan_requests():
    req = parse_scan_request({"steps": "2", "delay": "1", "baseline": "s20261121-051500-0a1b2c"}, max_steps=10)
    assert (req.steps, req.delay, req.baseline) == (2, 1, "s20261121-051500-0a1b2c")
    for params, param in [({"steps": "2", "baseline": "20261121-051500-0a1b2c"}, "baseline"),
                          ({"steps": "2", "activities": "cpu"}, "activities")]:
        with pytest.raises(ParamError) as info:
            parse_scan_request(params, max_steps=10)
        assert info.value.param == param


# int() and float() take more than the API means by a number: other scripts' digits ("٥", Arabic-Indic
# five), "_" separators, and float() "inf", "nan", "infinity". Only ASCII digits are numbers here.
@pytest.mark.parametrize("params, param", [
    ({"steps": "\u0665"}, "steps"),
    ({"steps": "1_0"}, "steps"),
    ({"steps": "\uff15"}, "steps"),  # fullwidth five
    ({"steps": "0x10"}, "steps"),
    ({"steps": ""}, "steps"),
    ({"steps": "+"}, "steps"),
    ({"steps": "9" * 5000}, "steps"),  # over int()'s own digit limit: still a 400, never a 500
    ({"steps": 5, "delay": "\u0661"}, "delay"),
    ({"steps": 5, "delay": "1_0"}, "delay"),
    ({"steps": 5, "timeout_s": "1_0"}, "timeout_s"),
    ({"steps": 5, "timeout_s": "\u0665"}, "timeout_s"),
    ({"steps": 5, "timeout_s": "Infinity"}, "timeout_s"),
    ({"steps": 5, "timeout_s": "-inf"}, "timeout_s"),
    ({"steps": 5, "timeout_s": "1e999"}, "timeout_s"),
    ({"steps": 5, "timeout_s": "0x10"}, "timeout_s"),
    ({"steps": 5, "timeout_s": "."}, "timeout_s"),
    ({"steps": 5, "stacks": "sampled", "stack_hz": "1_00"}, "stack_hz"),
    ({"steps": 5, "stacks": "sampled", "stack_hz": "\u0665\u0660"}, "stack_hz"),
    ({"steps": 5, "stacks": "sampled", "stack_hz": "inf"}, "stack_hz"),
    ({"steps": 5, "processes": "worker:"}, "processes"),
    ({"steps": 5, "processes": "worker: "}, "processes"),
    ({"steps": 5, "processes": "worker:\u0661"}, "processes"),
    ({"steps": 5, "processes": "worker:1_0"}, "processes"),
    ({"steps": 5, "processes": "worker:-1"}, "processes"),
    ({"steps": 5, "processes": "worker:1:2"}, "processes"),
])
def test_numbers_are_ascii_digits_only(params, param):
    with pytest.raises(ParamError) as info:
        parse(**params)
    assert info.value.param == param


@pytest.mark.parametrize("params, field, value", [
    ({"steps": " +7 "}, "steps", 7),
    ({"steps": "007"}, "steps", 7),
    ({"steps": 1, "timeout_s": " 2.5 "}, "timeout_s", 2.5),
    ({"steps": 1, "timeout_s": "3"}, "timeout_s", 3.0),
    ({"steps": 1, "timeout_s": ".5"}, "timeout_s", 0.5),
    ({"steps": 1, "timeout_s": "5."}, "timeout_s", 5.0),
    ({"steps": 1, "timeout_s": "1e2"}, "timeout_s", 100.0),
    ({"steps": 1, "stacks": "sampled", "stack_hz": "2.5E2"}, "stack_hz", 250.0),
    ({"steps": 1, "processes": "worker: 3 "}, "processes", (ProcessSelector("worker", 3),)),
])
def test_plain_ascii_numbers_are_still_accepted(params, field, value):
    assert getattr(parse(**params), field) == value


# -- /recorder's time range (start_ms, duration_ms): a span's own range, from a trace backend's link -------
NOW_NS = 1_800_000_000_000_000_000


def recorder(**params):
    from sidecar.service.jobs.params import parse_recorder_request
    return parse_recorder_request({k: str(v) for k, v in params.items()}, now_ns=NOW_NS)


def test_a_recorder_range_reaches_back_to_its_start_and_is_cut_to_it():
    start_ms = NOW_NS / 1e6 - 90_000
    req = recorder(start_ms=start_ms, duration_ms=2500)
    assert req.window_ns == (int(start_ms * 1e6), int(start_ms * 1e6) + 2_500_000_000)
    assert req.seconds == pytest.approx(90.0)
    assert recorder(start_ms=start_ms).window_ns[1] == int(start_ms * 1e6), "no duration: the instant"
    # A range running past now ends now; a start a little ahead (another host's clock) starts now.
    assert recorder(start_ms=start_ms, duration_ms=3_600_000).window_ns[1] == NOW_NS
    assert recorder(start_ms=NOW_NS / 1e6 + 5_000).window_ns == (NOW_NS, NOW_NS)
    assert recorder().window_ns is None and recorder(seconds=30).seconds == 30


@pytest.mark.parametrize("params, param", [
    ({"start_ms": "x"}, "start_ms"),
    ({"start_ms": NOW_NS / 1e6 - 3_601_000}, "start_ms"),  # beyond what the rings reach
    ({"start_ms": NOW_NS / 1e6 + 120_000}, "start_ms"),  # far in the future
    ({"duration_ms": 1000}, "start_ms"),
    ({"start_ms": NOW_NS / 1e6, "duration_ms": -1}, "duration_ms"),
    ({"start_ms": NOW_NS / 1e6, "seconds": 30}, "seconds"),
])
def test_a_bad_recorder_range_names_its_parameter(params, param):
    with pytest.raises(ParamError) as err:
        recorder(**params)
    assert err.value.param == param
