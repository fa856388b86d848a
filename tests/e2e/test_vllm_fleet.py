"""A fleet end to end (issue 31's first done-when): three sidecars, one beside a real vLLM server and two
beside stand-in engines (tests/fake_engine.py, one of them slower), all with ``--store`` on an
S3-compatible server running as its own process (moto's standalone server, as tests/test_store_moto.py
runs it), found by a real Prometheus through file-based service discovery. ``sidecar fleet capture``
(the CLI, as a user runs it) keeps three captures under one fleet id in the store, its table names the
slow replica, and a new sidecar on an empty disk with the same store lists the three and serves their
traces.

The vLLM server is this test's own (``--store`` is fixed at its sidecar's start, and the shared stacks
serve other tests without one): one server start, beside the session's idle ones.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from background_start import ENVIRON_AT_START
from sidecar.devtools.stack import Stack, free_port
from sidecar_vllm.devtools import VllmStack
from test_store_moto import BUCKET, Moto

pytestmark = pytest.mark.vllm

FAKE_ENGINE = Path(__file__).parents[1] / "fake_engine.py"
PREFIX = "fleet-e2e"
STORE_URL = f"s3://{BUCKET}/{PREFIX}"
JOB = "inference-sidecar"
STEPS = 3
# Planted inside every step of the stand-ins (a sleep inside the step): the even one near a tiny vLLM
# model's step on CPU, the slow one far above both. The outlier is the replica farthest from the median
# by ratio, so the slow one is named while its time over the median beats the median over the fastest
# one's: for any vLLM step time between 0.2 ms and ~170 ms (SLOW_STEP_MS * STEP_MS > vLLM's squared).
STEP_MS = 20.0
SLOW_STEP_MS = 1500.0
INSTANCES = ("replica-vllm", "replica-standin", "replica-slow")


def _base_env() -> dict[str, str]:
    """The session's environment without a caller's token or kubeconfig: none of these sidecars has a
    token, and discovery is Prometheus'."""
    return {k: v for k, v in ENVIRON_AT_START.items() if k not in ("SIDECAR_TOKEN", "KUBECONFIG")}


def _store_env(s3: Moto) -> dict[str, str]:
    """The store's endpoint and credentials through the standard AWS variables, as a pod gets them."""
    return {"AWS_ENDPOINT_URL": s3.url, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_REGION": "us-east-1"}


def _store_args(instance: str) -> tuple[str, ...]:
    return ("--store", STORE_URL, "--store-instance", instance)


@pytest.fixture
def s3():
    server = Moto(free_port())
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def replicas(s3, tiny_model, tmp_path_factory) -> Iterator[list[Stack]]:
    """[vLLM, the even stand-in, the slow stand-in], each sidecar storing to ``s3``."""
    with ExitStack() as held:
        stacks: list[Stack] = []
        for instance, step_ms in zip(INSTANCES[1:], (STEP_MS, SLOW_STEP_MS)):
            work = tmp_path_factory.mktemp(instance)
            stack = Stack(model_dir=work, work_dir=work, base_env=_base_env(), env=_store_env(s3),
                          sidecar_args=_store_args(instance))
            held.callback(stack.stop_sidecar)
            stack.start_sidecar()
            engine = subprocess.Popen([sys.executable, str(FAKE_ENGINE), "worker", "--rank", "0", "--slow-step-at", "1",
                                       "--slow-step-ms", str(step_ms)],
                                      env=stack._env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            held.callback(engine.wait)
            held.callback(engine.kill)
            stacks.append(stack)
        work = tmp_path_factory.mktemp(INSTANCES[0])
        vllm = VllmStack(model_dir=tiny_model, work_dir=work, base_env=_base_env(), env=_store_env(s3),
                         sidecar_args=_store_args(INSTANCES[0]))
        held.callback(vllm.close)
        vllm.start()
        for stack in stacks:
            stack.wait_for_processes(1, timeout=60)
        yield [vllm, *stacks]


@contextmanager
def prometheus_file_sd(folder: Path, targets: list[str]) -> Iterator[str]:
    """A real Prometheus whose job ``JOB`` finds ``targets`` (host:port) in a file_sd file; its URL once it
    lists every one as an active target."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus not installed: run scripts/install-test-backends.sh"
    sd = folder / "sidecars.json"
    sd.write_text(json.dumps([{"targets": targets, "labels": {"env": "e2e"}}]))
    file_sd = {"files": [str(sd)], "refresh_interval": "1s"}
    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": [{"job_name": JOB, "file_sd_configs": [file_sd]}]}
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([binary, f"--config.file={folder / 'prometheus.yml'}",
                             f"--storage.tsdb.path={folder / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                query = urllib.parse.urlencode({"state": "active"})
                active = _get(f"{url}/api/v1/targets?{query}")["data"]["activeTargets"]
                if sorted(t["labels"]["instance"] for t in active if t["labels"]["job"] == JOB) == sorted(targets):
                    break
            except OSError:
                pass
            assert proc.poll() is None, "prometheus exited"
            assert time.monotonic() < deadline, "Prometheus never listed the file_sd targets"
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


def _get(url: str, timeout: float = 10) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def _fleet(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sidecar.cli", "fleet", *args], capture_output=True, text=True,
                          timeout=timeout, env=_base_env())


def _stored(sidecar_url: str, capture_id: str, timeout: float = 90) -> dict:
    """The capture's JSON once its upload has ended (stored, failed or dropped)."""
    deadline = time.monotonic() + timeout
    while True:
        status = _get(f"{sidecar_url}/profile/{capture_id}")
        if (status.get("stored") or {}).get("state") in ("stored", "failed", "dropped"):
            return status
        assert time.monotonic() < deadline, f"{capture_id}: stored is still {status.get('stored')}"
        time.sleep(0.3)


def test_fleet_capture_found_through_prometheus_is_stored_and_served_by_a_new_sidecar(
        replicas, s3, background_load, tmp_path, tmp_path_factory):
    vllm, standin, slow = replicas
    urls = [s.sidecar_url for s in replicas]
    page = tmp_path / "fleet.html"
    with prometheus_file_sd(tmp_path, [u.split("://")[1] for u in urls]) as prometheus:
        with background_load(vllm, concurrency=2):  # an idle engine takes no steps
            began = time.monotonic()
            got = _fleet("capture", "--prometheus", prometheus, "--job", JOB, "--steps", str(STEPS), "-o", str(page))
            took = time.monotonic() - began
    print(f"\n$ sidecar fleet capture --prometheus {prometheus} --job {JOB} --steps {STEPS}  ({took:.1f} s)")
    print(got.stdout, end="")
    assert got.returncode == 0, got.stdout + got.stderr
    assert "Traceback" not in got.stderr

    # The table: one fleet id, one row per replica Prometheus scrapes, every capture done.
    lines = got.stdout.splitlines()
    head = re.fullmatch(rf"fleet (fleet-\d{{8}}-\d{{6}}-[0-9a-f]{{6}}): 3 replicas, {STEPS} steps each, "
                        r"start skew \d+ ms", lines[0])
    assert head, lines[0]
    fleet_id = head.group(1)
    rows = {}
    for url in urls:
        row = [line.split() for line in lines if line.startswith(url + " ")]
        assert len(row) == 1, f"no one row for {url}:\n{got.stdout}"
        rows[url] = row[0]
    assert all(row[2] == "done" for row in rows.values()), got.stdout
    # The slow stand-in is named, slower by about its planted step time.
    named = [line for line in lines if line.startswith("outlier: ")]
    assert len(named) == 1 and named[0].startswith(f"outlier: {slow.sidecar_url}, step time "), got.stdout
    value = float(re.search(r"step time ([0-9.]+) ms", named[0]).group(1))
    assert value >= SLOW_STEP_MS and named[0].endswith("slower)"), named[0]
    html = page.read_text()
    assert fleet_id in html and f"outlier: {slow.sidecar_url}," in html

    # Each sidecar keeps its capture under the fleet id and uploads it to the fleet's folder of the store.
    captures = {}
    for url, instance in zip(urls, INSTANCES):
        capture_id = rows[url][1]
        status = _stored(url, capture_id)
        assert status["state"] == "done" and status["fleet"] == fleet_id, status
        assert status["stored"] == {"url": f"{STORE_URL}/fleets/{fleet_id}/{instance}/{capture_id}/",
                                    "state": "stored", "error": None}, status["stored"]
        captures[capture_id] = url
    keys = s3.keys(f"{PREFIX}/fleets/{fleet_id}/")
    assert sorted(k for k in keys if k.endswith("/capture.json")) == sorted(
        f"{PREFIX}/fleets/{fleet_id}/{instance}/{rows[url][1]}/capture.json" for url, instance in zip(urls, INSTANCES))
    for url, instance in zip(urls, INSTANCES):
        folder = f"{PREFIX}/fleets/{fleet_id}/{instance}/{rows[url][1]}/"
        assert {folder + "trace.json.gz", folder + "summary.json"} <= set(keys), keys

    # A new pod: an empty disk, the same store. It lists the three and serves each trace, read back from
    # the store: the same bytes its replica wrote.
    work = tmp_path_factory.mktemp("new-pod")
    again = Stack(model_dir=work, work_dir=work, base_env=_base_env(), env=_store_env(s3),
                  sidecar_args=_store_args("replica-new"))
    try:
        again.start_sidecar()
        deadline = time.monotonic() + 60
        while True:
            listed = {c["id"]: c for c in _get(f"{again.sidecar_url}/profiles")["captures"]}
            if set(captures) <= set(listed):
                break
            assert time.monotonic() < deadline, f"the new sidecar lists {sorted(listed)}, not {sorted(captures)}"
            time.sleep(0.5)
        for capture_id, url in captures.items():
            status = _get(f"{again.sidecar_url}/profile/{capture_id}")
            assert status["state"] == "done" and status["fleet"] == fleet_id, status
            with urllib.request.urlopen(f"{again.sidecar_url}/profile/{capture_id}/trace", timeout=60) as resp:
                assert resp.status == 200
                body = resp.read()
            replica = next(s for s in replicas if s.sidecar_url == url)
            assert body == (replica.trace_dir / "captures" / capture_id / "trace.json.gz").read_bytes()
            events = json.loads(gzip.decompress(body))["traceEvents"]
            assert events, f"{capture_id}: an empty trace"
        print(f"a new sidecar on an empty disk listed and served {len(captures)} captures of {fleet_id}")
    finally:
        again.stop_sidecar()
