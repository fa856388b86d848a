"""The job window (sidecar/common/step_window.py): the pure schedule, and the state machine captures and
scans share, driven over step sequences the way a probe drives it."""

from __future__ import annotations

import random

import pytest

from sidecar.common.step_window import ARMED, FINISHED, RECORDING, Action, StepWindow, clip, opens_at, schedule

R, LAST, NONE = Action.RECORD, Action.RECORD_AND_STOP, Action.NONE


# -- the pure schedule ----------------------------------------------------------------------------
@pytest.mark.parametrize("first, steps, actions", [
    (0, 1, [LAST, NONE, NONE]),
    (0, 3, [R, R, LAST, NONE]),
    (2, 2, [NONE, NONE, R, LAST, NONE, NONE]),
    (5, 1, [NONE] * 5 + [LAST, NONE]),
])
def test_schedule_is_a_function_of_the_working_step_number(first, steps, actions):
    action = schedule(first, steps)
    assert [action(step) for step in range(len(actions))] == actions
    assert [action(step) for step in range(len(actions))] == actions  # no state: the same twice


@pytest.mark.parametrize("first, steps", [(0, 0), (3, -1), (-1, 2)])
def test_schedule_rejects_an_empty_window_and_negative_steps(first, steps):
    with pytest.raises(ValueError):
        schedule(first, steps)


@pytest.mark.parametrize("start, step, has_work, opens", [
    (None, 0, True, False),  # not begun
    (3, 2, True, False),  # before the start step
    (3, 3, True, True),
    (3, 3, False, False),  # an idle step never opens a window
    (3, 9, True, True),  # the start step passed: the next working step
])
def test_opens_at_the_first_working_step_at_or_after_the_start(start, step, has_work, opens):
    assert opens_at(start, step, has_work) is opens


def test_clip_keeps_errors_within_the_protocols_text_limit():
    assert clip("short") == "short"
    assert len(clip("x" * 10_000)) == 4096 and clip("x" * 10_000).endswith("…")


# -- the state machine, driven like a probe drives it --------------------------------------------
class Job(StepWindow):
    """Logs every hook call and report."""

    RECORDING_STATE = "recording"
    OPEN_FAILED = "failed to start"
    CANCELLED = "cancelled"

    def __init__(self, steps, fail_open=False):
        super().__init__(steps)
        self.log = []
        self.fail_open = fail_open

    def _start_recording(self):
        if self.fail_open:
            raise RuntimeError("boom")
        self.log.append("start")

    def _step_began(self, n, new):
        self.log.append(f"began {n}" + ("" if new else " again"))

    def _step_ended(self):
        self.log.append("ended")

    def _stop_recording(self):
        self.log.append("stop")
        self._report_state("done")

    def _report_state(self, state, **fields):
        self.log.append(f"report {state}" + "".join(f" {k}={v}" for k, v in sorted(fields.items())))


KINDS = {  # (has_work at the step's beginning, did_work at its end)
    "W": (True, True),  # a working step
    "i": (False, False),  # an idle step: nothing scheduled
    "x": (True, False),  # announced work, did none (an engine core with requests but nothing scheduled)
    "y": (False, True),  # did work it had not announced
}


def drive(job, script):
    """Run ``script`` (space-separated: W/i/x/y steps, ``b<k>`` begin(k), ``s`` a stop request) with
    the probe's step numbering: a step's number is the count of working steps before it."""
    steps = 0
    for token in script.split():
        if token.startswith("b"):
            job.begin(int(token[1:]))
        elif token == "s":  # logged once request_stop has returned (True: it ended the job there)
            job.log.append(f"stop requested -> {job.request_stop('asked')}")
        else:
            has_work, did_work = KINDS[token]
            job.on_step_begin(has_work, steps)
            if did_work:
                steps += 1
            job.on_step_end(did_work)
    return job


CASES = [
    # (name, N, script, log, state, first_step, steps_recorded)
    ("armed and never begun: nothing happens", 2, "W W i W", [], ARMED, None, 0),
    ("begin at 0: the next N working steps", 2, "b0 W W W",
     ["start", "report recording", "began 0", "ended", "began 1", "ended", "stop", "report done"], FINISHED, 0, 2),
    ("idle steps are neither recorded nor counted", 3, "b1 i W i W i i W W",
     ["start", "report recording", "began 0", "ended", "ended", "ended", "began 1", "ended", "began 2", "ended",
      "stop", "report done"], FINISHED, 1, 3),
    ("an idle step never opens the window", 1, "b0 i i W",
     ["start", "report recording", "began 0", "ended", "stop", "report done"], FINISHED, 0, 1),
    ("a start step in the future is waited for", 2, "b3 W W W W W",
     ["start", "report recording", "began 0", "ended", "began 1", "ended", "stop", "report done"], FINISHED, 3, 2),
    ("a begin that arrives late starts at the next working step", 1, "W W W b1 W",
     ["start", "report recording", "began 0", "ended", "stop", "report done"], FINISHED, 3, 1),
    ("a step that announced work and did none is not counted nor a new step", 2, "b0 x W W",
     ["start", "report recording", "began 0", "ended", "began 0 again", "ended", "began 1", "ended", "stop",
      "report done"], FINISHED, 0, 2),
    ("a step that did unannounced work is counted", 3, "b0 W y W",
     ["start", "report recording", "began 0", "ended", "ended", "began 2", "ended", "stop", "report done"],
     FINISHED, 0, 3),
    ("the window closes at the end of its last step, not at the next one", 1, "b0 W",
     ["start", "report recording", "began 0", "ended", "stop", "report done"], FINISHED, 0, 1),
    ("a stop while recording ends at the next step boundary, keeping what was recorded", 5, "b0 W W s W W",
     ["start", "report recording", "began 0", "ended", "began 1", "ended", "stop requested -> False", "stop",
      "report done"], FINISHED, 0, 2),
    ("a stop while armed cancels at once, from any thread", 2, "b5 W s W",
     ["report failed error=cancelled (asked)", "stop requested -> True"], FINISHED, None, 0),
    ("a stop after the end changes nothing", 1, "b0 W s",
     ["start", "report recording", "began 0", "ended", "stop", "report done", "stop requested -> True"],
     FINISHED, 0, 1),
]


@pytest.mark.parametrize("name, steps, script, log, state, first, recorded", CASES, ids=[c[0] for c in CASES])
def test_window_over_step_sequences(name, steps, script, log, state, first, recorded):
    job = drive(Job(steps), script)
    assert job.log == log
    assert (job.state, job.first_step, job.steps_recorded) == (state, first, recorded)


def test_a_recorder_that_fails_to_start_fails_the_job_once():
    job = drive(Job(2, fail_open=True), "b0 W W W")
    assert job.log == ["report failed error=failed to start: boom"]
    assert job.finished and job.first_step == 0


def test_stop_reason_is_kept_for_the_reports():
    job = drive(Job(5), "b0 W s")
    assert job.state == RECORDING and job._stop_reason == "asked"
    drive(job, "i")  # even an idle step is a boundary the step thread can stop at
    assert job.finished and job.log[-2:] == ["stop", "report done"]


def reference(script, steps):
    """What the window must do, read straight from its definition: the first working step at or after
    the start step (once begun), then exactly ``steps`` working steps. Returns (first, recorded)."""
    start = first = None
    number = recorded = 0
    for token in script.split():
        if token.startswith("b"):
            start = int(token[1:])
            continue
        has_work, did_work = KINDS[token]
        if first is None and start is not None and has_work and number >= start:
            first = number
        if first is not None and did_work and recorded < steps:
            recorded += 1
        number += did_work
    return first, recorded


@pytest.mark.parametrize("seed", range(40))
def test_random_sequences_against_the_definition(seed):
    rng = random.Random(seed)
    tokens = rng.choices("WWWWixy", k=rng.randint(0, 30))
    tokens.insert(rng.randint(0, len(tokens)), f"b{rng.randint(0, 12)}")
    script, steps = " ".join(tokens), rng.randint(1, 6)
    job = drive(Job(steps), script)
    first, recorded = reference(script, steps)
    assert (job.first_step, job.steps_recorded) == (first, recorded), script
    assert job.finished == (recorded == steps), script
    began = [line for line in job.log if line.startswith("began") and not line.endswith("again")]
    assert len(began) <= steps and job.log.count("stop") == job.finished
