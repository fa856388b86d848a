"""Issue 30 benchmark: how long from an alert's ``startsAt`` to the capture it asks for being armed,
through the real chain: Prometheus evaluating deploy/alerts.yml (the TTFT alert's ``for:`` made 2 s,
rules evaluated and the sidecar scraped every second), Alertmanager routing as deploy/alertmanager.yml
does (``group_wait: 0s``), the sidecar's ``POST /alerts`` and its action (a 3-step capture).

Starts real vLLM serving the slow-token fixture model (a prompt ending in SLOW_TOKEN_ID makes one 1.5 s
prefill step, so each such request's time to first token is over 1.5 s and their p95 over the rule's
2 s), and for each round a fresh Prometheus and Alertmanager (a new alert, a new ``startsAt``): slow
prompts one at a time until the alert's firing reaches the sidecar, then normal ones until its capture
ends. Prints each firing's ``start_to_armed_ms`` (the whole chain: Prometheus's send, Alertmanager's
dispatch, the webhook, the sidecar's decision and the capture's arming; one host, one clock) and
``arm_latency_ms`` (the sidecar's own part: the notification's arrival to the capture armed), and their
medians. The same chain is tests/e2e/test_vllm_triggers_alertmanager.py, whose helper this reuses.

python benchmarks/bench_alert_chain.py [--rounds 3] [--out bench-results/alert_chain.json]  (in make bench)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The tests' helpers (tests/alert_chain.py, the e2e test's chain) and the fixture package, installed by
# scripts/install.sh, whose source folder is the fallback.
sys.path[:0] = [str(ROOT), str(ROOT / "plugins"), str(ROOT / "tests"), str(ROOT / "tests" / "e2e")]
sys.path.append(str(ROOT / "tests" / "fixtures" / "slow_token_model"))

from alert_chain import E2E_ALERT_ACTIONS  # noqa: E402
from sidecar_vllm.devtools import VllmStack  # noqa: E402
from slow_token_model import make_model_dir  # noqa: E402
from test_vllm_triggers_alertmanager import run_alert_chain  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="alerts raised, each through a fresh Prometheus "
                                                              "and Alertmanager (default %(default)s)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "alert_chain.json",
                        help="write the figures here as JSON (default %(default)s)")
    args = parser.parse_args(argv)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench-alert-chain-") as tmp:
        work = Path(tmp)
        actions = work / "alert-actions.json"
        actions.write_text(json.dumps(E2E_ALERT_ACTIONS))
        stack = VllmStack(model_dir=make_model_dir(work / "model"), work_dir=work / "stack",
                          sidecar_args=("--alert-actions", str(actions))).start()
        try:
            for i in range(args.rounds):
                firing, capture = run_alert_chain(stack, work / f"round-{i}", salt=100 * (i + 1))
                rounds.append({"firing": firing["id"], "start_to_armed_ms": firing["start_to_armed_ms"],
                               "arm_latency_ms": firing["arm_latency_ms"], "capture": capture["id"],
                               "capture_state": capture["state"]})
                print(f"round {i + 1}: {firing['alert']['name']} startsAt {firing['alert']['starts_at']} -> capture "
                      f"armed {firing['start_to_armed_ms']:.0f} ms (sidecar {firing['arm_latency_ms']:.1f} ms); "
                      f"capture {capture['id']} {capture['state']}", flush=True)
        finally:
            stack.close()
    result = {"rounds": rounds,
              "median_start_to_armed_ms": statistics.median(r["start_to_armed_ms"] for r in rounds),
              "median_arm_latency_ms": statistics.median(r["arm_latency_ms"] for r in rounds)}
    print(f"median: alert startsAt -> capture armed {result['median_start_to_armed_ms']:.0f} ms, of which the "
          f"sidecar's own part {result['median_arm_latency_ms']:.1f} ms ({len(rounds)} rounds)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    return 0 if all(r["capture_state"] == "done" for r in rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
