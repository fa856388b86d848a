"""`sidecar serve` exports its own spans (a scan's ``sync_scan`` with a ``sync_site`` event per site) to the
OTLP backend the standard OTEL_* variables name, here a real OTLP/HTTP receiver; without one it sets up
nothing."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from otlp_receiver import OtlpReceiver
from sidecar.cli.client import SidecarClient
from sidecar.devtools.stack import Stack
from sidecar.service.tracing import start_tracing

FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")
PLANTED_LINE = next(n for n, line in enumerate(FAKE_ENGINE.read_text().splitlines(), 1) if "# PLANTED_LINE" in line)


def test_a_scan_is_a_span_in_the_users_backend(tmp_path):
    receiver = OtlpReceiver()
    stack = Stack(model_dir=tmp_path, work_dir=tmp_path, env={
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100",
        "SIDECAR_SYNC_TREAT_CPU_AS_DEVICE": "1"})
    engine = None
    try:
        stack.start_sidecar()
        engine = subprocess.Popen([sys.executable, str(FAKE_ENGINE), "worker", "--rank", "0", "--planted-sync"],
                                  env=stack._env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stack.wait_for_processes(1, timeout=60)
        client = SidecarClient(stack.sidecar_url, token="")
        scan = client.wait(client.request("POST", "/sync/start", {"steps": "3"})["id"], timeout=120, path="/sync/")
        assert scan["state"] == "done"
        deadline = time.monotonic() + 30
        while not (spans := [s for s in receiver.snapshot() if s["name"] == "sync_scan"]):
            assert time.monotonic() < deadline, f"no sync_scan span; received {[s['name'] for s in receiver.snapshot()]}"
            time.sleep(0.2)
        [span] = spans
        assert span["attributes"]["sidecar.sync.scan_id"] == scan["id"] and span["attributes"]["sidecar.sync.hidden_sites"] == 1
        sites = [e["attributes"] for e in span["events"] if e["name"] == "sync_site"]
        assert [(Path(a["code.filepath"]).name, a["code.lineno"], a["sidecar.sync.classification"]) for a in sites
                if a["sidecar.sync.classification"] == "hidden"] == [("fake_engine.py", PLANTED_LINE, "hidden")], sites
    finally:
        if engine is not None:
            engine.kill()
            engine.wait()
        stack.stop_sidecar()
        receiver.close()


def test_without_an_endpoint_nothing_is_set_up():
    assert start_tracing({}) is None
    assert start_tracing({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_TRACES_EXPORTER": "none"}) is None


def test_a_span_queue_smaller_than_the_sdks_default_batch_starts(tmp_path):
    # The SDK's own default batch is 512 spans and it refuses a batch larger than the queue: the sidecar
    # must pass the batch it computed (never above the queue), or `sidecar serve` dies at start.
    # In a child process, since a TracerProvider can be set only once per process.
    code = ("from sidecar.service.tracing import start_tracing\n"
            "shutdown = start_tracing()\n"
            "assert shutdown is not None\n"
            "shutdown()\n"
            "print('started')\n")
    env = {"PATH": "/usr/bin:/bin", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/v1/traces",
           "OTEL_BSP_MAX_QUEUE_SIZE": "64"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert done.returncode == 0 and "started" in done.stdout, done.stderr[-2000:]
