"""The always-on sync watch (sidecar/syncs/watch.py), with a stand-in for torch's CUDA sync debug mode
(tests/fake_cuda.py): this machine has no GPU, and torch's own switch raises without CUDA."""

import threading
import warnings

import pytest

from fake_cuda import FILE as FAKE_CUDA_FILE
from fake_cuda import SYNC_WARNING, FakeSwitch, make_sync_op
from sidecar.syncs.allowlist import AllowEntry, Allowlist
from sidecar.syncs.sites import SiteLocator, default_skip_dirs
from sidecar.syncs.watch import SyncWatch, cuda_unavailable_reason


@pytest.fixture
def shown():
    """Every warning that reaches the display (the hook the watch finds installed)."""
    seen = []
    with warnings.catch_warnings():
        warnings.resetwarnings()
        warnings.showwarning = lambda message, category, *rest, **kw: seen.append(str(message))
        yield seen


def make_watch(every=1, allowlist=None):
    switch = FakeSwitch()
    locator = SiteLocator(skip_dirs=default_skip_dirs() + (FAKE_CUDA_FILE,))
    watch = SyncWatch(switch, every=every, allowlist=allowlist or Allowlist(()), locator=locator)
    watch.install()
    return watch, switch, make_sync_op(switch)


def run_steps(watch, sync, steps, first=0):
    for step in range(first, first + steps):
        watch.step_begin(True, step)
        sync()  # SYNC_LINE
        watch.step_end()


SYNC_LINE = next(n for n, line in enumerate(open(__file__).read().splitlines(), 1) if line.endswith("# SYNC_LINE"))


def test_sites_are_found_with_their_line_and_counted_per_sampled_step(shown):
    watch, switch, sync = make_watch(every=1)
    try:
        run_steps(watch, sync, 3)
        report = watch.report()
    finally:
        watch.uninstall()
    assert shown == []  # nothing printed
    assert switch.mode == 0 and switch.sets == [1, 0, 1, 0, 1, 0]  # on for each step only
    [site] = report["sites"]
    assert (site["line"], site["function"], site["op"]) == (SYNC_LINE, "run_steps", "cuda_sync")
    assert site["path"].endswith("test_watch.py") and site["phase"] == "other"
    assert (site["count"], site["count_per_step"], site["first_step"], site["last_step"]) == (3, 1.0, 0, 2)
    assert site["classification"] == "hidden"
    assert report["sampled_steps"] == 3 and report["state"] == "watching"


def test_only_one_working_step_in_every_is_sampled(shown):
    watch, switch, sync = make_watch(every=4)
    try:
        for step in range(8):
            watch.step_begin(False, step)  # steps without work are not counted
            watch.step_end()
        run_steps(watch, sync, 8)
        report = watch.report()
    finally:
        watch.uninstall()
    assert report["sampled_steps"] == 2
    [site] = report["sites"]
    assert (site["count"], site["first_step"], site["last_step"]) == (2, 3, 7)  # the 4th and 8th working step


def test_other_threads_see_nothing_while_the_mode_is_on(shown):
    watch, switch, sync = make_watch(every=1)
    try:
        watch.step_begin(True, 0)
        other = threading.Thread(target=sync)  # another thread syncs during the sampled step
        other.start()
        other.join()
        watch.step_end()
        sync()  # between steps the mode is off: no warning at all
        report = watch.report()
    finally:
        watch.uninstall()
    assert shown == [] and report["sites"] == [] and report["dropped_other_threads"] == 1


def test_other_warnings_pass_through_and_uninstall_restores_everything(shown):
    filters_before = list(warnings.filters)
    hook_before = warnings.showwarning
    watch, switch, sync = make_watch(every=1)
    watch.step_begin(True, 0)
    warnings.warn("an unrelated warning")
    watch.step_end()
    watch.uninstall()
    assert shown == ["an unrelated warning"]
    assert warnings.showwarning is hook_before and warnings.filters == filters_before


def test_an_application_that_set_the_mode_itself_is_left_alone(shown):
    watch, switch, sync = make_watch(every=1)
    try:
        switch.set(1)  # the application's own sync debug mode
        watch.step_begin(True, 0)
        sync()
        watch.step_end()
        report = watch.report()
    finally:
        watch.uninstall()
    assert shown == [SYNC_WARNING]  # its warning reaches it as before
    assert report["sampled_steps"] == 0 and report["skipped_steps"] == 1 and report["sites"] == []
    assert switch.mode == 1


def test_a_displaced_hook_or_an_error_filter_is_put_back_before_sampling(shown):
    watch, switch, sync = make_watch(every=1)
    try:
        warnings.simplefilter("error")  # would turn the step thread's sync warnings into exceptions
        warnings.showwarning = lambda *a, **k: shown.append("displaced")
        run_steps(watch, sync, 2)  # must not raise
        report = watch.report()
    finally:
        watch.uninstall()
    assert report["sites"][0]["count"] == 2 and "displaced" not in shown


def test_allowlisted_sites_are_expected(shown):
    allow = Allowlist((AllowEntry("*test_watch.py", "run_steps", reason="deliberate"),))
    watch, switch, sync = make_watch(every=1, allowlist=allow)
    try:
        run_steps(watch, sync, 1)
        [site] = watch.report()["sites"]
    finally:
        watch.uninstall()
    assert (site["classification"], site["reason"]) == ("expected", "deliberate")


def test_a_failing_switch_never_breaks_the_step(shown):
    class Broken(FakeSwitch):
        def set(self, mode):
            raise RuntimeError("driver error")

    watch = SyncWatch(Broken(), every=1, allowlist=Allowlist(()))
    watch.install()
    try:
        watch.step_begin(True, 0)
        watch.step_end()
    finally:
        watch.uninstall()
    assert watch.errors == 1 and not watch.on


def test_bad_sampling_interval_is_refused():
    with pytest.raises(ValueError, match="every"):
        SyncWatch(FakeSwitch(), every=0)


def test_this_cpu_only_torch_cannot_run_the_watch():
    reason = cuda_unavailable_reason()
    assert reason is not None and "CUDA" in reason
