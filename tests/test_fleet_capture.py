"""``sidecar fleet`` as a user runs it against three real sidecar processes, each beside a stand-in engine
(tests/fake_engine.py), one of them slower and one with a token: one capture per replica under one fleet
id, the table naming the slow one, the JSON's shape, a partial answer when a target is down or refuses
the token, the HTML page, the flight-recorder comparison and the gathering commands; discovery through a
real Prometheus with file-based service discovery."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from sidecar.devtools.stack import Stack, free_port

FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")
TOKEN = "fleet-test-token-0123456789abcdef"
SLOW_STEP_MS = 60.0  # inside every step of the slow replica; the others' steps take a few ms


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Three sidecars, each with one stand-in worker: [0] plain, [1] slow, [2] with a token."""
    stacks, engines = [], []
    try:
        for i, (slow, token) in enumerate(((False, None), (True, None), (False, TOKEN))):
            work = tmp_path_factory.mktemp(f"fleet-{i}")
            stack = Stack(model_dir=work, work_dir=work, env={"SIDECAR_TOKEN": token} if token else {},
                          base_env=_env())  # no token of the caller's: only [2] has one
            stack.start_sidecar()
            stacks.append(stack)
            extra = ("--slow-step-at", "1", "--slow-step-ms", str(SLOW_STEP_MS)) if slow else ()
            engines.append(subprocess.Popen([sys.executable, str(FAKE_ENGINE), "worker", "--rank", "0", *extra],
                                            env=stack._env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for stack in stacks:
            _wait_for_processes(stack, 1, token=TOKEN if stack.env.get("SIDECAR_TOKEN") else None)
        yield stacks
    finally:
        for proc in engines:
            proc.kill()
            proc.wait()
        for stack in stacks:
            stack.stop_sidecar()


def _wait_for_processes(stack: Stack, count: int, token: str | None, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        req = urllib.request.Request(f"{stack.sidecar_url}/processes",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                if len(json.loads(resp.read())["processes"]) >= count:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"no engine process connected to {stack.sidecar_url}")


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k not in ("SIDECAR_TOKEN", "KUBECONFIG")}


def cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sidecar.cli", "fleet", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env())


def _tokens_file(tmp_path: Path, mapping: dict[str, str]) -> Path:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(mapping))
    path.chmod(0o600)
    return path


def _urls(stacks: list[Stack]) -> list[str]:
    return [s.sidecar_url for s in stacks]


def test_capture_on_three_replicas_names_the_slow_one(fleet, tmp_path):
    tokens = _tokens_file(tmp_path, {fleet[2].sidecar_url: TOKEN})
    page = tmp_path / "fleet.html"
    done = cli("capture", "--targets", ",".join(_urls(fleet)), "--tokens-file", str(tokens), "--steps", "3",
               "--json", "-o", str(page))
    assert done.returncode == 0, done.stdout + done.stderr
    answer = json.loads(done.stdout)
    assert set(answer) >= {"fleet_id", "replicas", "outlier", "failed", "skew_ms", "steps"}
    assert answer["failed"] == []
    assert [r["target"] for r in answer["replicas"]] == _urls(fleet)
    for r in answer["replicas"]:
        assert {"target", "capture", "stored", "state", "step_ms", "gpu_busy", "top", "syncs", "ttft_p99_ms"} <= set(r)
        assert r["state"] == "done" and r["steps"] == 3 and r["step_ms"] > 0, r
        assert r["top"], r  # a CPU trace: its top op
    # One fleet id, on every capture the sidecars keep.
    captures = {}
    for stack, r in zip(fleet, answer["replicas"]):
        req = urllib.request.Request(f"{stack.sidecar_url}/profile/{r['capture']}",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            captures[stack.sidecar_url] = json.loads(resp.read())
    assert {c.get("fleet") for c in captures.values()} == {answer["fleet_id"]}, captures
    # The slow replica is the outlier, by about its planted step time against the others'.
    slow = fleet[1].sidecar_url
    outlier = answer["outlier"]
    assert outlier is not None and outlier["target"] == slow and outlier["measure"] == "step_ms"
    others = [r["step_ms"] for r in answer["replicas"] if r["target"] != slow]
    assert outlier["value"] >= SLOW_STEP_MS > 2 * max(others), answer["replicas"]
    assert outlier["median"] == sorted(r["step_ms"] for r in answer["replicas"])[1]
    assert outlier["direction"] == "slower" and outlier["ratio"] >= 1.25
    assert answer["skew_ms"] is not None and answer["skew_ms"] >= 0
    html = page.read_text()
    assert answer["fleet_id"] in html and "outlier" in html and slow in html
    assert html.count("<tr>") == 1 + len(fleet)  # the header and one row per replica

    # The same as a table: the outlier line names the slow replica.
    text = cli("capture", "--targets", ",".join(_urls(fleet)), "--tokens-file", str(tokens), "--steps", "3")
    assert text.returncode == 0, text.stderr
    assert f"outlier: {slow}," in text.stdout, text.stdout
    assert text.stderr == "", "no progress line when stderr is not a terminal"
    assert TOKEN not in text.stdout + text.stderr


def test_a_target_down_and_a_wrong_token_are_named_and_the_rest_answer(fleet, tmp_path):
    down = f"http://127.0.0.1:{free_port()}"
    tokens = _tokens_file(tmp_path, {fleet[2].sidecar_url: "wrong-token-of-the-right-length-000"})
    got = cli("status", "--targets", ",".join([*_urls(fleet), down]), "--tokens-file", str(tokens), "--json",
              "--timeout", "5")
    assert got.returncode == 1, got.stdout + got.stderr
    answer = json.loads(got.stdout)
    assert [r["target"] for r in answer["replicas"]] == _urls(fleet)[:2]
    assert all(r["healthz"]["status"] and len(r["processes"]) == 1 for r in answer["replicas"])
    failed = {f["target"]: f["error"] for f in answer["failed"]}
    assert set(failed) == {fleet[2].sidecar_url, down}
    assert failed[fleet[2].sidecar_url].startswith("HTTP 401")
    assert "cannot reach" in failed[down]
    assert "Traceback" not in got.stderr and "wrong-token" not in got.stdout + got.stderr

    # The readable form names them too; nobody answering is exit 2.
    text = cli("requests", "--targets", ",".join([*_urls(fleet), down]), "--tokens-file", str(tokens))
    assert text.returncode == 1 and "not answered (2):" in text.stdout and down in text.stdout, text.stdout
    none = cli("status", "--targets", down, "--timeout", "3")
    assert none.returncode == 2 and "cannot reach" in none.stdout, none.stdout + none.stderr


def test_recorder_compares_the_replicas_without_a_capture(fleet, tmp_path):
    tokens = _tokens_file(tmp_path, {"*": TOKEN})  # a sidecar without a token ignores one
    page = tmp_path / "recorder.html"
    got = cli("recorder", "--targets", ",".join(_urls(fleet)), "--tokens-file", str(tokens), "--seconds", "30",
              "--json", "-o", str(page))
    assert got.returncode == 0, got.stdout + got.stderr
    answer = json.loads(got.stdout)
    assert answer["fleet_id"] is None and answer["failed"] == []
    rows = {r["target"]: r for r in answer["replicas"]}
    assert all(r["steps"] > 0 and r["step_ms"] > 0 for r in rows.values()), rows
    assert answer["outlier"]["target"] == fleet[1].sidecar_url
    assert rows[fleet[1].sidecar_url]["step_ms"] >= SLOW_STEP_MS
    assert "Fleet flight recorders" in page.read_text()


def test_stacks_and_triggers_on_every_sidecar(fleet, tmp_path):
    tokens = _tokens_file(tmp_path, {"*": TOKEN})
    targets = ",".join(_urls(fleet))
    stacks = cli("stacks", "--targets", targets, "--tokens-file", str(tokens))
    assert stacks.returncode == 0, stacks.stderr
    assert all(f"===== {url}" in stacks.stdout for url in _urls(fleet)) and "fake_engine.py" in stacks.stdout

    rule = tmp_path / "rule.json"
    rule.write_text(json.dumps({"name": "fleet-slow-step", "metric": "step_duration", "threshold_ms": 5000,
                                "action": {"capture_steps": 0, "recorder_seconds": 5}}))
    added = cli("triggers", "--targets", targets, "--tokens-file", str(tokens), "--add", str(rule), "--json")
    assert added.returncode == 0, added.stdout + added.stderr
    ids = {r["target"]: r["added"][0]["id"] for r in json.loads(added.stdout)["replicas"]}
    assert set(ids) == set(_urls(fleet))
    listed = json.loads(cli("triggers", "--targets", targets, "--tokens-file", str(tokens), "--json").stdout)
    for r in listed["replicas"]:
        assert ids[r["target"]] in {t["id"] for t in r["triggers"]}
    for url, trigger_id in ids.items():
        gone = cli("triggers", "--targets", url, "--tokens-file", str(tokens), "--delete", trigger_id)
        assert gone.returncode == 0 and f"deleted {trigger_id}" in gone.stdout, gone.stdout + gone.stderr


def test_prometheus_file_sd_finds_the_sidecars(fleet, tmp_path):
    prometheus = __import__("shutil").which("prometheus")
    assert prometheus, "prometheus not installed: run scripts/install-test-backends.sh"
    sd = tmp_path / "sidecars.json"
    sd.write_text(json.dumps([{"targets": [url.split("://")[1] for url in _urls(fleet)],
                               "labels": {"env": "test"}}]))
    config = {"global": {"scrape_interval": "1s"},
              "scrape_configs": [{"job_name": "inference-sidecar", "file_sd_configs": [{"files": [str(sd)],
                                                                                         "refresh_interval": "1s"}]},
                                 {"job_name": "other", "static_configs": [{"targets": ["127.0.0.1:9"]}]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:  # file_sd is read once Prometheus has started
            try:
                with urllib.request.urlopen(f"{url}/api/v1/targets?" + urllib.parse.urlencode({"state": "active"}),
                                            timeout=2) as resp:
                    active = json.loads(resp.read())["data"]["activeTargets"]
                if sum(1 for t in active if t["labels"]["job"] == "inference-sidecar") == 3:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "Prometheus never listed the three file_sd targets"
            time.sleep(0.3)
        tokens = _tokens_file(tmp_path, {fleet[2].sidecar_url.split("://")[1]: TOKEN})  # by host:port
        got = cli("status", "--prometheus", url, "--job", "inference-sidecar", "--tokens-file", str(tokens), "--json")
        assert got.returncode == 0, got.stdout + got.stderr
        answer = json.loads(got.stdout)
        assert sorted(r["target"] for r in answer["replicas"]) == sorted(_urls(fleet))
        assert {r["name"] for r in answer["replicas"]} == {u.split("://")[1] for u in _urls(fleet)}  # the instance label
        wrong = cli("status", "--prometheus", url, "--job", "no-such-job")
        assert wrong.returncode == 2 and "no active target of job 'no-such-job'" in wrong.stderr
        assert "inference-sidecar" in wrong.stderr and "other" in wrong.stderr  # the jobs it has
    finally:
        proc.terminate()
        proc.wait(20)
