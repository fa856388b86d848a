"""Figures a reader can trust: engine steps counted once, cut-off steps named and left out of the mean,
headline and body written alike, kernel names that stay distinct, devices and ranks told apart."""

from sidecar.analysis import analyze_path, format_report
from sidecar.analysis.summary import unique_short_names

from . import synth as S


def _process(pid: int, name: str, step_durations: list[float], kernel_dur: float = 0.0, device: int = 0) -> list:
    events, t = [S.process_name(pid, name)], 0.0
    for n, dur in enumerate(step_durations):
        events.append(S.step(n, t, dur, pid=pid, tid=pid))
        if kernel_dur:
            corr = pid * 100 + n
            events.append(S.runtime("cudaLaunchKernel", t + 1, 2, corr, pid=pid, tid=pid))
            events.append(S.kernel("k", t + 5, kernel_dur, corr, device=device, pid=1000 + pid))
        t += dur
    return events


def test_the_headline_counts_engine_steps_and_leaves_a_cut_off_one_out(tmp_path):
    # Two processes record the same 5 engine steps (the last range of each cut off where recording
    # stopped) and an API server records one window: 5 steps of 2 ms, not 11 markers.
    events = (_process(1, "engine core (pid 1)", [2000, 2000, 2000, 2000, 90])
              + _process(2, "worker rank 0 (pid 2)", [2000, 2000, 2000, 2000, 60])
              + _process(3, "API server (pid 3)", [500_000]))
    summary = analyze_path(S.write(tmp_path / "t.json", events))
    assert "5 steps, 2.00 ms/step (2 cut off, left out)" in summary["headline"], summary["headline"]
    worker = next(p for p in summary["processes"] if p["pid"] == 2)
    assert [s["partial"] for s in worker["steps"]] == [False, False, False, False, True]
    api = next(p for p in summary["processes"] if p["pid"] == 3)
    assert [s["partial"] for s in api["steps"]] == [False]
    report = format_report(summary)
    assert sum(line.endswith("  cut off") for line in report.splitlines()) == 2
    assert "left out of the mean step time" in report


def test_a_short_last_step_that_is_not_cut_off_stays_in(tmp_path):
    summary = analyze_path(S.write(tmp_path / "t.json", _process(1, "worker rank 0 (pid 1)", [2000, 2000, 1500])))
    assert [s["partial"] for s in summary["steps"]] == [False, False, False]
    assert "3 steps, 1.83 ms/step · " in summary["headline"] and "cut off" not in summary["headline"]
    one = analyze_path(S.write(tmp_path / "one.json", _process(1, "worker rank 0 (pid 1)", [2000])))
    assert "1 step, 2.00 ms/step" in one["headline"]


def test_headline_and_body_write_gpu_busy_alike_and_name_each_device(tmp_path):
    # Two workers, one GPU each: 2 ms of 4 ms busy on one, 40 µs of 4 ms on the other; 2.04 ms of 8 ms in all.
    events = (_process(1, "worker rank 0 (pid 1)", [2000, 2000], kernel_dur=1000, device=0)
              + _process(2, "worker rank 1 (pid 2)", [2000, 2000], kernel_dur=20, device=0))
    summary = analyze_path(S.write(tmp_path / "t.json", events))
    assert summary["headline"].startswith("GPU busy 25.5% (2 devices, 1.0%–50.0%)"), summary["headline"]
    report = format_report(summary)
    assert "device 0 of worker rank 0 (pid 1): busy 50.0%" in report
    assert "device 0 of worker rank 1 (pid 2): busy 1.0%" in report
    assert "(25.5%)" in report.split("== All processes")[1]


def test_kernel_names_stay_distinct():
    a = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >(int)"
    b = "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>, at::detail::Array<char*, 3> >(int)"
    c = "void at::native::reduce_kernel<512, 1>(at::native::ReduceOp<float>)"
    names = unique_short_names([a, b, c], width=70)
    assert len(set(names.values())) == 3
    assert names[c] == "at::native::reduce_kernel"
    assert "FillFunctor" in names[a] and "AddFunctor" in names[b]
    # When even the template arguments do not fit apart, they are numbered.
    narrow = unique_short_names([a, b], width=40)
    assert sorted(narrow.values()) == ["at::native::vectorized_elementwise_k [1]", "at::native::vectorized_elementwise_k [2]"]


def test_one_rank_claimed_by_two_files_is_a_warning(tmp_path):
    for name, start in (("a.json", 0), ("b.json", 10**12)):  # the second on an unrelated clock
        events = [S.step(0, start, 100, pid=10, tid=10)]
        S.write(tmp_path / name, events, distributedInfo={"rank": 0, "world_size": 2})
    summary = analyze_path(tmp_path)
    [warning] = [w for w in summary["warnings"] if "rank 0" in w]
    assert "a.json, b.json" in warning and "unrelated clocks" in warning
