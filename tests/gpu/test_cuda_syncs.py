"""Real GPU->CPU syncs: the planted `.item()` of the stand-in worker found by a scan (no CPU-as-device
stand-in) and by the always-on watch (CUDA's own sync debug mode)."""

import time
from pathlib import Path

from sidecar.common.verdicts import FINAL

from host import FAKE_ENGINE

PLANTED_LINE = next(n for n, line in enumerate(FAKE_ENGINE.read_text().splitlines(), 1) if "# PLANTED_LINE" in line)


def _wait(call, done, timeout=120):
    deadline = time.monotonic() + timeout
    while True:
        body = call()
        if done(body):
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.2)


def test_a_scan_finds_the_planted_item_and_how_long_it_stalled(gpu_host):
    with gpu_host() as host:
        host.standard_engine("--planted-sync")
        started = host.client.request("POST", "/sync/start", {"steps": "4"})
        result = _wait(lambda: host.client.request("GET", started["url"]), lambda b: b["state"] in FINAL)
        assert result["state"] == "done" and result["treat_cpu_as_device"] is False, result
        hidden = [s for s in result["sites"] if s["classification"] == "hidden"]
        assert [(Path(s["file"]).name, s["line"], s["op"]) for s in hidden] == [("fake_engine.py", PLANTED_LINE, "item")]
        # The step's products (two 4096^2 fp32 products' worth of work) run while the host waits in .item().
        assert hidden[0]["count"] == 4 and hidden[0]["blocked_us"] > 100, hidden[0]


def test_the_always_on_watch_sees_the_planted_sync(gpu_host):
    with gpu_host() as host:
        host.standard_engine("--planted-sync", SIDECAR_SYNC_WATCH="1", SIDECAR_SYNC_WATCH_EVERY="2")
        watch = _wait(lambda: host.client.request("GET", "/syncs/watch"),
                      lambda b: any(s["line"] == PLANTED_LINE for s in b["sites"]))
        worker = next(p for p in watch["processes"] if p["process"].startswith("worker"))
        assert worker["state"] == "watching" and worker["sampled_steps"] > 0, worker
        site = next(s for s in watch["sites"] if s["line"] == PLANTED_LINE)
        assert Path(site["file"]).name == "fake_engine.py" and site["classification"] == "hidden", site
        assert not any("sidecar" in s["file"] for s in watch["sites"]), "nothing from the project's own code"
