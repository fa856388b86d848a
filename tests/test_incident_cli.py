"""``sidecar recorder``, ``sidecar stacks``, ``sidecar requests`` (sidecar/cli/incidents.py): what each asks
the sidecar, what it writes or prints, and a clear message with exit 2 when the sidecar refuses."""

from __future__ import annotations

import argparse
import gzip
import json

from sidecar.cli import incidents as incident_cli
from sidecar.cli.client import SidecarClient, SidecarError


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    incident_cli.register(parser.add_subparsers())
    return parser.parse_args(list(argv))


def test_recorder_to_a_gz_file_asks_for_a_trace_and_compresses_it(monkeypatch, tmp_path):
    asked = []
    monkeypatch.setattr(SidecarClient, "call", lambda self, method, path, params=None: asked.append(
        (method, path, params)) or b'{"traceEvents": []}')
    out = tmp_path / "rec.json.gz"
    args = parse("recorder", "--url", "http://127.0.0.1:9", "--seconds", "30", "-o", str(out))
    assert args.handler(args) == 0
    assert asked == [("GET", "/recorder", {"seconds": 30.0, "format": "trace"})]
    assert json.loads(gzip.decompress(out.read_bytes())) == {"traceEvents": []}


def test_recorder_printed_is_json_rows_for_the_selected_processes(monkeypatch, capsys):
    asked = []
    monkeypatch.setattr(SidecarClient, "call", lambda self, method, path, params=None: asked.append(params) or b"{}")
    args = parse("recorder", "--url", "http://127.0.0.1:9", "--processes", "worker:0")
    assert args.handler(args) == 0
    assert asked == [{"seconds": 120.0, "format": "json", "processes": "worker:0"}]
    assert capsys.readouterr().out == "{}\n"


def test_stacks_passes_the_sampling_options_and_native(monkeypatch, capsys):
    asked = []
    monkeypatch.setattr(SidecarClient, "call", lambda self, method, path, params=None: asked.append(
        (path, params)) or b"Process 1: worker\n")
    args = parse("stacks", "--url", "http://127.0.0.1:9", "--seconds", "2", "--hz", "50", "--threads", "step")
    assert args.handler(args) == 0
    assert asked[-1] == ("/stacks", {"seconds": 2.0, "hz": 50.0, "format": "text", "threads": "step"})
    assert capsys.readouterr().out == "Process 1: worker\n"
    args = parse("stacks", "--url", "http://127.0.0.1:9", "--native")
    assert args.handler(args) == 0
    assert asked[-1] == ("/stacks", {"format": "text", "mode": "native"})


def test_requests_prints_one_line_per_request_oldest_first(monkeypatch, capsys):
    answer = {"count": 2, "oldest_age_s": 12.5, "by_phase": {}, "processes": [
        {"process": "engine core (pid 2)", "knows_requests": True, "error": None},
        {"process": "worker rank 0 (pid 3)", "knows_requests": False, "error": "no answer within 2 s"}],
        "requests": [{"id": "cmpl-a", "age_s": 12.5, "phase": "prefill", "prompt_tokens": 9, "output_tokens": 0},
                     {"id": "cmpl-b", "age_s": 0.5, "phase": "decode", "prompt_tokens": 5, "output_tokens": 7}]}
    monkeypatch.setattr(SidecarClient, "call", lambda self, method, path, params=None: json.dumps(answer).encode())
    args = parse("requests", "--url", "http://127.0.0.1:9")
    assert args.handler(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "2 requests in flight, the oldest 12.5 s old"
    assert "prefill" in lines[1] and "cmpl-a" in lines[1] and "cmpl-b" in lines[2]
    assert lines[3] == "  (worker rank 0 (pid 3): no answer within 2 s)"


def test_a_refusal_of_the_sidecar_is_a_message_and_exit_2(monkeypatch, capsys):
    def refuse(self, method, path, params=None):
        raise SidecarError(400, {"error": "bad_parameter", "param": "seconds", "message": "seconds: must be between 0 and 60"})

    monkeypatch.setattr(SidecarClient, "call", refuse)
    args = parse("stacks", "--url", "http://127.0.0.1:9", "--seconds", "99")
    assert args.handler(args) == 2
    assert "sidecar stacks: HTTP 400: seconds: must be between 0 and 60" in capsys.readouterr().err


def test_an_unreachable_sidecar_is_a_message_and_exit_2(capsys):
    args = parse("requests", "--url", "http://127.0.0.1:9")
    assert args.handler(args) == 2
    assert "sidecar requests:" in capsys.readouterr().err


def test_triggers_add_list_show_delete(monkeypatch, capsys, tmp_path):
    calls = []
    rule = {"metric": "step_duration", "threshold_ms": 1000}
    trigger = {"id": "trg-1", "rule": {"name": "step_duration step > 1000 ms"}, "counts": {"fired": 2, "skipped": 1}}

    def call(self, method, path, params=None, body=None):
        calls.append((method, path, body))
        if method == "GET" and path == "/triggers":
            return json.dumps({"triggers": [trigger]}).encode()
        if method == "DELETE":
            return b'{"deleted": "trg-1"}'
        return json.dumps(trigger).encode()

    monkeypatch.setattr(SidecarClient, "call", call)
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps([rule, {**rule, "threshold_ms": 2000}]))
    for argv, out in [(("--add", str(rules)), "added trg-1: step_duration step > 1000 ms"),
                      ((), "  trg-1  step_duration step > 1000 ms  fired 2, skipped 1"),
                      (("--show", "trg-1"), '"id": "trg-1"'),
                      (("--delete", "trg-1"), "deleted trg-1")]:
        args = parse("triggers", "--url", "http://127.0.0.1:9", *argv)
        assert args.handler(args) == 0
        assert out in capsys.readouterr().out
    assert calls[:2] == [("POST", "/triggers", rule), ("POST", "/triggers", {**rule, "threshold_ms": 2000})]
    assert calls[-1] == ("DELETE", "/triggers/trg-1", None)


def test_triggers_add_a_file_that_is_not_json_or_a_rule_refused(monkeypatch, capsys, tmp_path):
    bad = tmp_path / "rules.json"
    bad.write_text("{not json")
    args = parse("triggers", "--url", "http://127.0.0.1:9", "--add", str(bad))
    assert args.handler(args) == 2 and str(bad) in capsys.readouterr().err

    def refuse(self, method, path, params=None, body=None):
        raise SidecarError(400, {"error": "bad_parameter", "param": "cooldown_s", "message": "cooldown_s: must be in [1, 86400], got 0"})

    monkeypatch.setattr(SidecarClient, "call", refuse)
    bad.write_text(json.dumps({"metric": "step_duration", "threshold_ms": 1, "cooldown_s": 0}))
    assert args.handler(args) == 2
    assert "cooldown_s: must be in [1, 86400], got 0" in capsys.readouterr().err
