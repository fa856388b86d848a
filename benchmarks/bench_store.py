"""The cost of the object store's upload path to serving: a stand-in engine's step time while captures
are taken back to back, with and without ``sidecar serve --store`` (uploads to a local S3-compatible
server, moto's standalone server from scripts/install-test-backends.sh, as its own process).

Each round starts ``sidecar serve`` in its own process and one stand-in engine worker
(tests/fake_engine.py, a real probe, ``--step-ms`` of sleep plus a small matrix product per step),
then takes ``--captures`` captures of ``--steps`` steps one after the other; meanwhile the engine's
step rate is read from ``/processes`` (its heartbeats) every half second. With the store, every
capture's files and capture.json are uploaded in the background while the next capture runs, and
the time from a capture's end to ``stored`` is reported too. Prints the median step time of each
mode and their ratio (1.00: no cost measurable).

python benchmarks/bench_store.py [--captures 8] [--steps 5] [--step-ms 5] [--out bench-results/store.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MOTO = ROOT / ".venv" / "moto" / "bin" / "moto_server"
FAKE_ENGINE = ROOT / "tests" / "fake_engine.py"
BUCKET = "bench"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, token: str, method: str = "GET") -> dict:
    req = urllib.request.Request(url, method=method, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _start_moto() -> tuple[subprocess.Popen, str]:
    if not MOTO.exists():
        raise SystemExit(f"{MOTO} is missing: run scripts/install-test-backends.sh")
    port = _free_port()
    proc = subprocess.Popen([str(MOTO), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(urllib.request.Request(f"{url}/{BUCKET}", method="PUT"), timeout=2).read()
            return proc, url
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise SystemExit("moto_server did not start")
            time.sleep(0.2)


def _start_sidecar(work: Path, env: dict[str, str], extra: list[str]) -> tuple[subprocess.Popen, str, str]:
    token_file = work / "token"
    exe = Path(sys.executable).with_name("sidecar")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c", "import sys; from sidecar.cli import main; sys.exit(main())"]
    proc = subprocess.Popen([*cmd, "serve", "--port", "0", "--trace-dir", str(work / "traces"), "--log-level", "WARNING",
                             "--min-free-mb", "0", *extra], stderr=subprocess.PIPE, text=True,
                            env={**env, "SIDECAR_TOKEN_FILE": str(token_file)}, cwd=work)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        m = re.search(r"listening on (http://\S+)", line or "")
        if m:
            subprocess.Popen(["cat"], stdin=proc.stderr, stdout=subprocess.DEVNULL)  # drain its log
            return proc, m.group(1), token_file.read_text().strip()
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit("the sidecar did not start")


def _round(work: Path, args: argparse.Namespace, store: str | None, env: dict[str, str]) -> dict:
    work.mkdir(parents=True)
    sidecar, url, token = _start_sidecar(work, env, ["--store", store] if store else [])
    engine = subprocess.Popen([sys.executable, str(FAKE_ENGINE), "worker", "--rank", "0", "--step-ms", str(args.step_ms)],
                              env={**env, "SIDECAR_ENDPOINT": url, "SIDECAR_TOKEN": token, "OMP_NUM_THREADS": "1",
                                   "SIDECAR_TRACE_DIR": str(work / "probe-root"), "SIDECAR_TOKEN_FILE": str(work / "none")},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not [p for p in _get(f"{url}/processes", token)["processes"] if p.get("step_rate")]:
            if time.monotonic() > deadline:
                raise SystemExit("the stand-in engine did not connect")
            time.sleep(0.2)
        rates, ids = [], []
        for _ in range(args.captures):
            cid = _get(f"{url}/profile/start?steps={args.steps}", token, "POST")["id"]
            ids.append(cid)
            while _get(f"{url}/profile/{cid}", token)["state"] not in ("done", "partial", "failed", "cancelled"):
                procs = _get(f"{url}/processes", token)["processes"]
                rates += [p["step_rate"] for p in procs if p.get("step_rate")]
                time.sleep(0.5)
        upload_s = []
        if store:
            for cid in ids:
                while True:
                    body = _get(f"{url}/profile/{cid}", token)
                    if body["stored"]["state"] in ("stored", "failed", "dropped"):
                        break
                    procs = _get(f"{url}/processes", token)["processes"]
                    rates += [p["step_rate"] for p in procs if p.get("step_rate")]
                    time.sleep(0.2)
                if body["stored"]["state"] != "stored":
                    raise SystemExit(f"capture {cid}: {body['stored']}")
                upload_s.append(os.stat(work / "traces" / "captures" / cid / "capture.json").st_mtime - body["finished_at"])
        step_ms = [1000.0 / r for r in rates]
        return {"store": store, "captures": len(ids), "samples": len(step_ms),
                "median_step_ms": statistics.median(step_ms), "p90_step_ms": sorted(step_ms)[int(0.9 * (len(step_ms) - 1))],
                "median_upload_s": statistics.median(upload_s) if upload_s else None}
    finally:
        engine.kill()
        engine.wait()
        sidecar.terminate()
        sidecar.wait(20)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--captures", type=int, default=8, help="captures per mode (default %(default)s)")
    parser.add_argument("--steps", type=int, default=5, help="steps per capture (default %(default)s)")
    parser.add_argument("--step-ms", type=float, default=5.0, help="the stand-in engine's sleep per step")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "store.json")
    args = parser.parse_args(argv)
    moto, endpoint = _start_moto()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "plugins"), os.environ.get("PYTHONPATH", "")]),
           "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
           "AWS_REGION": "us-east-1"}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
            without = _round(Path(tmp) / "local", args, None, env)
            with_store = _round(Path(tmp) / "store", args, f"s3://{BUCKET}/bench", env)
    finally:
        moto.terminate()
        moto.wait(10)
    ratio = with_store["median_step_ms"] / without["median_step_ms"]
    for r in (without, with_store):
        print(f"{'--store s3 (moto)' if r['store'] else 'local disk only':18s} median step {r['median_step_ms']:.2f} ms, "
              f"p90 {r['p90_step_ms']:.2f} ms over {r['samples']} samples, {r['captures']} captures"
              + (f"; capture end to stored: median {r['median_upload_s']:.2f} s" if r["median_upload_s"] is not None else ""))
    print(f"step time ratio with/without the store: {ratio:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"without": without, "with_store": with_store, "ratio": ratio}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
