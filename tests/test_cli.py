"""The console command: clear messages and non-zero exits on bad input, never a traceback."""

import subprocess
import sys


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "sidecar.cli", *args], capture_output=True, text=True, timeout=120, env=env)


def test_serve_refuses_a_public_bind_without_a_token(tmp_path):
    import os

    env = {k: v for k, v in os.environ.items() if k != "SIDECAR_TOKEN"}
    result = run("serve", "--host", "0.0.0.0", "--trace-dir", str(tmp_path), env=env)
    assert result.returncode == 2
    assert "--token" in result.stderr and "Traceback" not in result.stderr


def test_capture_reports_an_unreachable_sidecar(tmp_path):
    result = run("capture", "--url", "http://127.0.0.1:9", "--steps", "5")
    assert result.returncode == 2
    assert "cannot reach the sidecar" in result.stderr and "Traceback" not in result.stderr


def test_unknown_command_and_bad_flags_exit_non_zero():
    assert run("frobnicate").returncode == 2
    bad = run("serve", "--port", "not-a-number")
    assert bad.returncode == 2 and "invalid int value" in bad.stderr


def test_make_model_builds_a_loadable_model(tmp_path):
    out = tmp_path / "m"
    result = run("make-model", "--size", "tiny", "--out", str(out))
    assert result.returncode == 0, result.stderr
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    assert AutoConfig.from_pretrained(out).model_type == "llama"
    prompt = tok.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    assert tok.decode(tok.encode("the model server")) == "the model server"


def test_help_lists_every_command_and_a_command_loads_only_its_own_module():
    result = run("--help")
    assert result.returncode == 0
    for command in ("serve", "capture", "analyze", "make-model"):
        assert command in result.stdout
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; from sidecar.cli import build_parser; build_parser('analyze');"
         "print(sorted(m for m in ('sidecar.cli.serve', 'sidecar.cli.client', 'sidecar.cli.make_model') if m in sys.modules))"],
        capture_output=True, text=True, timeout=60,
    )
    assert probe.stdout.strip() == "[]", probe.stderr


def test_serves_trace_dir_defaults_to_the_shared_trace_root_when_set(monkeypatch, tmp_path):
    from pathlib import Path

    from sidecar.cli import build_parser

    monkeypatch.delenv("SIDECAR_TRACE_DIR", raising=False)
    assert build_parser("serve").parse_args(["serve"]).trace_dir == Path("traces")
    monkeypatch.setenv("SIDECAR_TRACE_DIR", str(tmp_path / "shared"))
    assert build_parser("serve").parse_args(["serve"]).trace_dir == tmp_path / "shared"
    flag = build_parser("serve").parse_args(["serve", "--trace-dir", str(tmp_path / "mine")])
    assert flag.trace_dir == tmp_path / "mine"  # the flag overrides


def _serve_env(tmp_path, **extra):
    """The user's environment without a token, and a token file of the test's own."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "SIDECAR_TOKEN"}
    return {**env, "SIDECAR_TOKEN_FILE": str(tmp_path / "token"), **extra}


def test_serve_refuses_a_short_token_from_the_flag_or_the_environment(tmp_path):
    base = ("serve", "--port", "0", "--trace-dir", str(tmp_path / "traces"))
    for args, env in [(("--token", "short"), _serve_env(tmp_path)),
                      ((), _serve_env(tmp_path, SIDECAR_TOKEN="x" * 15)),
                      (("--token", "sixteen chars ok"), _serve_env(tmp_path))]:  # 16, but a space
        result = run(*base, *args, env=env)
        assert result.returncode == 2, (args, result.stderr)
        assert "token" in result.stderr and "Traceback" not in result.stderr
        assert not (tmp_path / "token").exists(), "a refused token must not be written for the probes"
    assert "at least 16 characters" in run(*base, "--token", "a", env=_serve_env(tmp_path)).stderr


def test_serve_refuses_a_short_token_left_in_the_token_file(tmp_path):
    (tmp_path / "token").write_text("a\n")
    result = run("serve", "--port", "0", "--trace-dir", str(tmp_path / "traces"), env=_serve_env(tmp_path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert str(tmp_path / "token") in result.stderr and "at least 16 characters" in result.stderr


def test_serve_help_says_token_shows_in_ps_and_names_the_environment():
    result = run("serve", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "SIDECAR_TOKEN" in text and "ps" in text and "at least 16" in text


def test_a_served_sidecar_answers_in_json_even_what_the_http_parser_refuses(tmp_path):
    """`sidecar serve` itself, on a free port: its startup line gives the port; `--token` warns that
    `ps` shows it; a lower-case bearer scheme is taken; a request aiohttp's parser refuses (an unknown
    method), answered before any of the app's code runs, is still JSON; SIGTERM ends it cleanly."""
    import json
    import re
    import socket
    import urllib.request

    token = "a-token-for-this-test-0123"
    proc = subprocess.Popen([sys.executable, "-m", "sidecar.cli", "serve", "--port", "0", "--token", token,
                             "--trace-dir", str(tmp_path / "traces")],
                            stderr=subprocess.PIPE, text=True, env=_serve_env(tmp_path))
    try:
        lines = []
        for line in proc.stderr:  # bounded by pytest's timeout should the sidecar hang
            lines.append(line)
            if "listening on" in line:
                break
        found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", lines[-1])
        assert found, lines
        port = int(found.group(1))
        warning = " ".join(lines[:-1])
        assert "--token" in warning and "ps" in warning and "SIDECAR_TOKEN" in warning, lines

        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"FOO /profile/start HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.split(b"\r\n")[0].split()[1] == b"400", data
        assert b"content-type: application/json" in head.lower(), data
        assert json.loads(body)["error"] == "bad_request"

        request = urllib.request.Request(f"http://127.0.0.1:{port}/processes",
                                         headers={"Authorization": f"bearer {token}"})
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert json.loads(resp.read()) == {"processes": []}
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def test_capture_passes_the_stack_options(monkeypatch, capsys):
    """``sidecar capture --stacks traced --stack-hz 250`` asks the sidecar for exactly that, and the
    summary line says per process which stacks it recorded."""
    import argparse

    from sidecar.cli import client, jobs as jobs_cli

    asked = {}
    final = {"id": "c1", "state": "done", "reason": None, "trace": None, "headline": None, "processes": [
        {"label": "engine core (pid 1)", "role": "engine_core", "state": "done", "steps_recorded": 5,
         "error": None, "bytes": 0, "file": None, "stacks": "sampled"},
        {"label": "worker rank 0 (pid 2)", "role": "worker", "state": "done", "steps_recorded": 5,
         "error": None, "bytes": 0, "file": None, "stacks": "traced"}]}
    monkeypatch.setattr(client.SidecarClient, "start", lambda self, steps, **params: asked.update(params, steps=steps) or {"id": "c1"})
    monkeypatch.setattr(client.SidecarClient, "wait", lambda self, capture_id, timeout, **kw: final)
    parser = argparse.ArgumentParser()
    jobs_cli.register(parser.add_subparsers())
    args = parser.parse_args(["capture", "--url", "http://127.0.0.1:9", "--stacks", "traced", "--stack-hz", "250"])
    assert args.handler(args) == 0
    assert asked["stacks"] == "traced" and asked["stack_hz"] == 250.0 and asked["steps"] == 5
    out = capsys.readouterr().out
    assert "sampled stacks" in out and "traced stacks" in out
    bad = run("capture", "--url", "http://127.0.0.1:9", "--stacks", "all")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_serve_checks_its_retention_and_free_space_flags(tmp_path):
    base = ("serve", "--port", "0", "--trace-dir", str(tmp_path / "traces"))
    for flag, value, says in (("--keep-mb", "0", "--keep-mb must be positive"),
                              ("--min-free-mb", "-1", "--min-free-mb must be 0 or more")):
        result = run(*base, flag, value, env=_serve_env(tmp_path))
        assert result.returncode == 2 and says in result.stderr and "Traceback" not in result.stderr, result.stderr
    from sidecar.cli import build_parser

    args = build_parser("serve").parse_args(["serve", "--keep-mb", "100", "--min-free-mb", "0"])
    assert (args.keep_mb, args.min_free_mb) == (100, 0)
