"""The probe's side of request-scoped captures: which requests ask (the header, baggage, bad values),
the ask from an event loop (answered, skipped, timed out, cancelled, disconnected), and a capture
bound to a request in a step-driven probe: it begins at arm, and ends on the step thread when the
engine integration says the request ended."""

from __future__ import annotations

import asyncio
import threading

import pytest
from starlette.datastructures import Headers

from sidecar.probe import Probe
from sidecar.probe.profile_header import MAX_BAGGAGE_CHARS, ProfileAsk, read_profile_ask
from sidecar.probe.request_capture import (DEFAULT_REQUEST_CAPTURE_STEPS, ENV_REQUEST_CAPTURE_STEPS, RequestCaptureAsks,
                                           steps_from_environment)
from sidecar.common.protocol import (REQUEST_ENDED, Arm, Begin, CaptureReport, CaptureSpec, RequestCapture,
                              RequestCaptureAnswer, RequestCaptureRelease)
from sidecar.common.protocol_codec import encode


# -- the ask in a request's headers ----------------------------------------------------------------
@pytest.mark.parametrize("value", ["1", "true", "TRUE", " yes ", "On"])
def test_the_header_asks_with_any_boolean_true(value):
    assert read_profile_ask(Headers({"X-Sidecar-Profile": value})) == ProfileAsk(True)


@pytest.mark.parametrize("value", ["0", "false", "no", "off", ""])
def test_the_header_says_no_with_any_boolean_false(value):
    assert read_profile_ask(Headers({"X-Sidecar-Profile": value})) == ProfileAsk(False)


def test_a_bad_value_asks_for_nothing_and_says_why_without_echoing_it_whole():
    ask = read_profile_ask(Headers({"X-Sidecar-Profile": "banana"}))
    assert not ask.asked and ask.problem.startswith("X-Sidecar-Profile: 'banana' is not 1/0, true/false")
    long = read_profile_ask(Headers({"X-Sidecar-Profile": "x" * 5000 + "\x00"}))
    assert not long.asked and len(long.problem) < 200


def test_baggage_asks_when_the_header_does_not_decide():
    assert read_profile_ask(Headers({"baggage": "sidecar.profile=1"})).asked
    # Several members, properties, spaces, percent-encoding, repeated baggage headers.
    raw = [(b"baggage", b"userid=7;p=1"), (b"baggage", b"a=b , sidecar.profile = %74rue ;ttl=5")]
    assert read_profile_ask(Headers(raw=raw)).asked
    assert read_profile_ask({"baggage": "sidecar.profile=1"}).asked  # a plain mapping too
    # The header decides when it holds a boolean, whatever the baggage says; not when it does not.
    assert not read_profile_ask(Headers({"X-Sidecar-Profile": "0", "baggage": "sidecar.profile=1"})).asked
    assert read_profile_ask(Headers({"X-Sidecar-Profile": "?", "baggage": "sidecar.profile=1"})).asked
    bad = read_profile_ask(Headers({"baggage": "sidecar.profile=maybe"}))
    assert not bad.asked and bad.problem.startswith("baggage sidecar.profile='maybe'")


def test_headers_without_an_ask_or_malformed_ask_for_nothing():
    for headers in (Headers({}), Headers({"baggage": "garbage;;,=,=x"}), {"baggage": "other=1"}, None, 42,
                    Headers({"baggage": "a=" + "x" * MAX_BAGGAGE_CHARS + ",sidecar.profile=1"})):
        assert read_profile_ask(headers) == ProfileAsk(False)


def test_the_cap_comes_from_the_environment(caplog):
    assert steps_from_environment({}) == DEFAULT_REQUEST_CAPTURE_STEPS == 32
    assert steps_from_environment({ENV_REQUEST_CAPTURE_STEPS: "8"}) == 8
    assert steps_from_environment({ENV_REQUEST_CAPTURE_STEPS: "0"}) == 0  # off
    assert steps_from_environment({ENV_REQUEST_CAPTURE_STEPS: "many"}) == 32
    assert ENV_REQUEST_CAPTURE_STEPS in caplog.text


# -- the ask, from the event loop -------------------------------------------------------------------
class Link:
    """Stands in for the probe's link: what is sent, and a sidecar that answers from another thread."""

    def __init__(self, answer=None) -> None:
        self.sent: list = []
        self.connected = threading.Event()
        self.connected.set()
        self.asks: RequestCaptureAsks | None = None
        self.answer = answer  # callable(RequestCapture) -> RequestCaptureAnswer | None (no answer)

    def send(self, msg) -> None:
        encode(msg)
        self.sent.append(msg)
        if isinstance(msg, RequestCapture) and self.answer is not None:
            reply = self.answer(msg)
            if reply is not None:  # from the link thread, as a real answer arrives
                threading.Thread(target=self.asks.on_answer, args=(reply,)).start()


def asks_with(link: Link, wait_s: float = 1.0) -> RequestCaptureAsks:
    link.asks = RequestCaptureAsks(link.send, link.connected, "http://127.0.0.1:8787/", wait_s=wait_s)
    return link.asks


def test_an_armed_answer_gives_the_capture_and_its_url():
    link = Link(lambda m: RequestCaptureAnswer(ask=m.ask, capture_id="20261123-000000-abcdef",
                                               url="/profile/20261123-000000-abcdef"))
    outcome = asyncio.run(asks_with(link).ask("cmpl-a-0", 32))
    assert (outcome.capture_id, outcome.url, outcome.skipped) == (
        "20261123-000000-abcdef", "http://127.0.0.1:8787/profile/20261123-000000-abcdef", None)
    assert link.sent == [RequestCapture(ask=1, request_id="cmpl-a-0", steps=32)]


def test_a_skipped_answer_and_a_missing_sidecar_send_the_request_on_at_once():
    link = Link(lambda m: RequestCaptureAnswer(ask=m.ask, skipped="busy: capture x is capturing"))
    assert asyncio.run(asks_with(link).ask("cmpl-b-0", 32)).skipped == "busy: capture x is capturing"
    link.connected.clear()
    outcome = asyncio.run(asks_with(link).ask("cmpl-c-0", 32))
    assert outcome.skipped == "the sidecar is not connected" and len(link.sent) == 1


def test_no_answer_in_time_releases_the_ask():
    link = Link()
    outcome = asyncio.run(asks_with(link, wait_s=0.05).ask("cmpl-d-0" + "x" * 1000, 32))
    assert outcome.skipped == "no answer from the sidecar within 0.05 s"
    ask, release = link.sent
    assert len(ask.request_id) == 512, "a client's long X-Request-Id is cut to what the protocol carries"
    assert release == RequestCaptureRelease(ask=ask.ask, reason="the request went on after 0.05 s without an answer")
    # The answer that comes too late finds nobody waiting.
    link.asks.on_answer(RequestCaptureAnswer(ask=ask.ask, capture_id="c"))


def test_a_request_cancelled_while_it_waits_releases_its_ask():
    link = Link()
    asks = asks_with(link, wait_s=5)

    async def main():
        task = asyncio.ensure_future(asks.ask("cmpl-e-0", 32))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert link.sent[-1] == RequestCaptureRelease(ask=1, reason="the request was cancelled while it waited")


def test_a_disconnect_sends_every_waiting_request_on():
    link = Link()
    asks = asks_with(link, wait_s=5)

    async def main():
        waiting = [asyncio.ensure_future(asks.ask(f"cmpl-{i}", 32)) for i in range(3)]
        await asyncio.sleep(0.05)
        threading.Thread(target=asks.on_disconnect).start()
        return await asyncio.gather(*waiting)

    outcomes = asyncio.run(main())
    assert {o.skipped for o in outcomes} == {"the sidecar disconnected before answering"}


# -- a capture bound to a request, in a step-driven probe ------------------------------------------
class Sent(list):
    def send(self, msg):
        encode(msg)
        self.append(msg)


def make_probe(role="worker", rank=0):
    probe = Probe(role, rank, endpoint="http://127.0.0.1:9", cuda_available=False)
    sent = Sent()
    probe._link.send = sent.send
    return probe, sent


def steps(probe, n, has_work=True):
    for _ in range(n):
        probe.step_begin(has_work)
        probe.step_end(has_work)


def wait_done(sent, job_id):
    for _ in range(500):
        if any(m.state in ("done", "failed") for m in sent if isinstance(m, CaptureReport) and m.job_id == job_id):
            return [m for m in sent if isinstance(m, CaptureReport) and m.job_id == job_id]
        threading.Event().wait(0.02)
    raise AssertionError(sent)


def test_a_bound_capture_begins_at_arm_and_ends_with_its_request_on_the_step_thread(tmp_path):
    probe, sent = make_probe()
    steps(probe, 3)
    probe._on_message(Arm(spec=CaptureSpec(id="r1", steps=32, request_id="cmpl-a-0")))
    assert sent == [CaptureReport(job_id="r1", state="armed", steps_seen=3, step_rate=sent[0].step_rate)]
    steps(probe, 1, has_work=False)  # idle steps record nothing
    steps(probe, 4)  # the request's prefill and three decode steps: no begin needed
    assert probe._capture.state == "recording"
    probe._on_message(Begin(job_id="r1", start_step=3))  # late: changes nothing
    assert not probe.end_capture("other", REQUEST_ENDED)
    assert probe.end_capture("r1", REQUEST_ENDED)  # between steps, on this (the step) thread
    assert probe._capture is None
    reports = wait_done(sent, "r1")
    assert [r.state for r in reports] == ["armed", "capturing", "exporting", "done"]
    assert (reports[-1].first_step, reports[-1].steps_recorded, reports[-1].stop_reason) == (3, 4, REQUEST_ENDED)
    assert not probe.end_capture("r1", REQUEST_ENDED), "ended once"


def test_the_sidecars_begin_aligns_a_bound_capture_that_has_not_begun():
    probe, sent = make_probe()
    steps(probe, 5)
    probe._on_message(Arm(spec=CaptureSpec(id="r2", steps=2, request_id="cmpl-b-0")))
    probe._on_message(Begin(job_id="r2", start_step=6))  # another process was a step ahead
    steps(probe, 1)
    assert probe._capture.state == "armed"
    steps(probe, 2)  # the cap: ends by itself
    reports = wait_done(sent, "r2")
    assert (reports[-1].state, reports[-1].first_step, reports[-1].steps_recorded) == ("done", 6, 2)


def test_a_request_that_ends_before_its_first_step_cancels_its_capture():
    probe, sent = make_probe()
    probe._on_message(Arm(spec=CaptureSpec(id="r3", steps=32, request_id="cmpl-c-0")))
    assert probe.end_capture("r3", REQUEST_ENDED)
    assert probe._capture is None
    assert sent[-1] == CaptureReport(job_id="r3", state="failed", stop_reason=REQUEST_ENDED,
                                     error=f"no step recorded before the capture ended ({REQUEST_ENDED})")


def test_an_end_from_another_thread_waits_for_the_step_boundary():
    probe, sent = make_probe()
    probe._on_message(Arm(spec=CaptureSpec(id="r4", steps=32, request_id="cmpl-d-0")))
    steps(probe, 2)
    other = threading.Thread(target=probe.end_capture, args=("r4", REQUEST_ENDED))
    other.start()
    other.join()
    assert probe._capture.state == "recording", "torch.profiler stops only on the thread that started it"
    steps(probe, 1)  # the next step boundary closes it, before recording that step
    reports = wait_done(sent, "r4")
    assert (reports[-1].state, reports[-1].steps_recorded, reports[-1].stop_reason) == ("done", 2, REQUEST_ENDED)
