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
         "print(sorted(m for m in ('sidecar.service.cli', 'sidecar.client', 'sidecar.devtools.local_model') if m in sys.modules))"],
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
