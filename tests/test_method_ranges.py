"""sidecar.integration.method_ranges: an engine's methods get named ranges only while switched on, under
a real torch.profiler; off, the object's own methods are back and nothing of the switch is left."""

import asyncio

import torch
from torch.profiler import ProfilerActivity, profile

from sidecar.integration.method_ranges import MethodRanges


class Engine:
    def __init__(self):
        self.calls = 0

    def schedule(self, n):
        self.calls += 1
        return torch.ones(n).sum().item()

    async def handle(self, n):
        await asyncio.sleep(0)
        return n * 2

    def other(self):
        return "other"


def annotations(prof) -> list[str]:
    return [e.name for e in prof.events() if e.name.startswith("range:")]


def test_ranges_exist_only_while_on():
    engine = Engine()
    ranges = MethodRanges(lambda: [(engine, "schedule", "range: schedule"), (engine, "handle", "range: handle"),
                                   (None, "schedule", "range: none"), (engine, "missing", "range: missing")])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        assert engine.schedule(3) == 3.0  # before: no range
        ranges(True)
        assert ranges.on and "schedule" in engine.__dict__ and "missing" not in engine.__dict__
        assert engine.schedule(4) == 4.0 and asyncio.run(engine.handle(5)) == 10
        ranges(False)
        assert engine.schedule(2) == 2.0  # after: no range
    assert sorted(annotations(prof)) == ["range: handle", "range: schedule"]
    assert engine.calls == 3 and not ranges.on
    assert "schedule" not in engine.__dict__ and "handle" not in engine.__dict__
    ranges(False)  # off twice: nothing to do


def test_a_method_shadowed_by_someone_else_is_left_alone_and_on_twice_wraps_once():
    engine = Engine()
    theirs = lambda: "theirs"  # noqa: E731
    engine.other = theirs
    ranges = MethodRanges(lambda: [(engine, "other", "range: other"), (engine, "schedule", "range: schedule")])
    ranges(True)
    wrapped = engine.__dict__["schedule"]
    ranges(True)
    assert engine.__dict__["schedule"] is wrapped and engine.other is theirs
    ranges(False)
    assert engine.other is theirs and "schedule" not in engine.__dict__


def test_a_context_manager_method_gets_a_range_around_its_with_block():
    import contextlib

    class Core:
        @contextlib.contextmanager
        def waiting(self):
            yield "value"

    core = Core()
    ranges = MethodRanges(lambda: [(core, "waiting", "range: wait", True)])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ranges(True)
        with core.waiting() as value:
            torch.ones(8).sum()
        ranges(False)
    assert value == "value"
    [wait] = [e for e in prof.events() if e.name == "range: wait"]
    [inside] = [e for e in prof.events() if e.name == "aten::sum"]
    # The range spans the block, not only the call that made the context manager.
    assert wait.time_range.start <= inside.time_range.start and inside.time_range.end <= wait.time_range.end
    assert "waiting" not in core.__dict__
