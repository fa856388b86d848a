"""One costly query at a time in an engine process, on the probe's side (issue 27, item 3): whatever the
sidecar sends (one that ignores its own slot, a relay injecting frames), a probe runs at most one stacks
sampling or recorder dump, and answers any other stacks or recorder query with a ``busy:`` error."""

import threading

import pytest

from sidecar.stacks import threads as thread_stacks
from sidecar.probe.queries import QueryAnswerer
from sidecar.common.protocol import Query


class Answers:
    """What the probe sent, waited for by query id (answers come from the link thread or a worker thread)."""

    def __init__(self) -> None:
        self._by_id: dict[int, object] = {}
        self._arrived = threading.Condition()

    def send(self, answer) -> None:
        with self._arrived:
            self._by_id[answer.query_id] = answer
            self._arrived.notify_all()

    def of(self, query_id: int):
        with self._arrived:
            assert self._arrived.wait_for(lambda: query_id in self._by_id, timeout=10), f"no answer to {query_id}"
            return self._by_id[query_id]


class HeldSampler:
    """Stands in for ``thread_stacks.ThreadSampler``: counts the samplers started, and each sampling runs
    until the test releases it."""

    started: list["HeldSampler"] = []

    def __init__(self, seconds, hz, **_kwargs) -> None:
        self.seconds = seconds
        self.running = threading.Event()
        self.release = threading.Event()
        self.fail = False
        HeldSampler.started.append(self)

    def run(self) -> dict:
        self.running.set()
        assert self.release.wait(10), "never released"
        if self.fail:
            raise RuntimeError("sampler broke")
        return {"seconds": self.seconds, "samples": 0, "stacks": []}


@pytest.fixture
def held_samplers(monkeypatch):
    HeldSampler.started = []
    monkeypatch.setattr(thread_stacks, "ThreadSampler", HeldSampler)
    yield HeldSampler.started
    for sampler in HeldSampler.started:  # never leave a sampling thread waiting
        sampler.release.set()


def _answerer(answers: Answers, tmp_path, recorder_dump=lambda seconds: {"gc": {}}) -> QueryAnswerer:
    return QueryAnswerer(send=answers.send, recorder_dump=recorder_dump,
                         recorder_file=lambda q: str(tmp_path / "recorder" / f"worker-pid1-q{q}.json"),
                         step_thread_id=lambda: None, in_flight=lambda: [])


def _sampling_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "inference-sidecar-stacks"]


def test_a_second_sampling_is_refused_busy_and_starts_no_second_sampler(held_samplers, tmp_path):
    answers = Answers()
    probe = _answerer(answers, tmp_path)
    earlier = set(_sampling_threads())  # another test's, still ending
    probe.answer(Query(query_id=1, kind="stacks", seconds=60, hz=1000))
    assert held_samplers and held_samplers[0].running.wait(10)

    probe.answer(Query(query_id=2, kind="stacks", seconds=60, hz=1000))
    refused = answers.of(2)
    assert refused.data is None and refused.error.startswith("busy: ")
    assert "a stacks sampling of 60 s is already running" in refused.error
    assert len(held_samplers) == 1 and len(set(_sampling_threads()) - earlier) == 1

    held_samplers[0].release.set()
    first = answers.of(1)
    assert first.error is None and first.data["seconds"] == 60
    # Once it has answered, the next sampling runs.
    probe.answer(Query(query_id=3, kind="stacks", seconds=1, hz=100))
    assert len(held_samplers) == 2 and held_samplers[1].running.wait(10)
    held_samplers[1].release.set()
    assert answers.of(3).error is None


def test_a_snapshot_or_recorder_dump_while_a_sampling_runs_is_refused_and_requests_still_answered(
        held_samplers, tmp_path):
    answers = Answers()
    dumped = []
    probe = _answerer(answers, tmp_path, recorder_dump=lambda seconds: dumped.append(seconds) or {})
    probe.answer(Query(query_id=1, kind="stacks", seconds=5))
    assert held_samplers[0].running.wait(10)
    probe.answer(Query(query_id=2, kind="stacks"))  # a snapshot
    probe.answer(Query(query_id=3, kind="recorder", seconds=60))
    probe.answer(Query(query_id=4, kind="requests"))
    for query_id in (2, 3):
        assert answers.of(query_id).error.startswith("busy: a stacks sampling of 5 s"), answers.of(query_id)
    assert not dumped and not (tmp_path / "recorder").exists()
    assert answers.of(4).error is None and answers.of(4).data == {"known": True, "requests": []}
    held_samplers[0].release.set()
    assert answers.of(1).error is None


def test_a_failed_sampling_frees_the_slot(held_samplers, tmp_path):
    answers = Answers()
    probe = _answerer(answers, tmp_path)
    probe.answer(Query(query_id=1, kind="stacks", seconds=5))
    assert held_samplers[0].running.wait(10)
    held_samplers[0].fail = True
    held_samplers[0].release.set()
    assert "sampler broke" in answers.of(1).error
    probe.answer(Query(query_id=2, kind="stacks"))
    assert answers.of(2).error is None and "threads" in answers.of(2).data


def test_a_second_recorder_dump_is_refused_while_one_is_written(tmp_path):
    answers = Answers()
    dumping, release = threading.Event(), threading.Event()
    calls = []

    def slow_dump(seconds):
        calls.append(seconds)
        dumping.set()
        assert release.wait(10)
        return {"gc": {}}

    probe = _answerer(answers, tmp_path, recorder_dump=slow_dump)
    probe.answer(Query(query_id=1, kind="recorder", seconds=60))
    assert dumping.wait(10)
    probe.answer(Query(query_id=2, kind="recorder", seconds=60))
    assert answers.of(2).error.startswith("busy: a recorder dump")
    release.set()
    assert answers.of(1).error is None and answers.of(1).file.endswith("-q1.json")
    assert calls == [60]


def test_the_busy_answer_tells_the_sidecar_when_to_retry():
    """The probe writes it, the sidecar reads it (its 429's Retry-After): one format."""
    from sidecar.probe.queries import busy_error
    from sidecar.service.channel.query_slots import probe_busy_retry_s

    assert probe_busy_retry_s(busy_error("a stacks sampling of 60 s", 41.2)) == 42
    assert probe_busy_retry_s(busy_error("a recorder dump", 0.0)) == 1
    assert probe_busy_retry_s("TimeoutError: something else") is None
