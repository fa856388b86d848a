"""The token file is written so that nobody else can redirect or pre-empt it (issue 27, item 5): through
a temporary file of a fresh name in the token's folder, never through a predictable one that a planted
symbolic link could send elsewhere, and only in a folder no other user can write to (``sidecar serve``
refuses one, naming it and what to do)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from served import serve_env
from sidecar.common import auth

VICTIM_TEXT = "a file of the user's, which a link planted in the token folder points at\n"


def test_a_link_planted_at_the_old_temporary_name_is_not_followed(tmp_path):
    folder = tmp_path / "private"
    folder.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text(VICTIM_TEXT)
    token_path = folder / "token"
    planted = token_path.with_suffix(".tmp")
    planted.symlink_to(victim)

    token = auth.ensure_token_file(token_path, None)

    assert victim.read_text() == VICTIM_TEXT, "the link was followed: the victim was overwritten"
    assert not token_path.is_symlink() and token_path.read_text() == token
    assert stat.S_IMODE(token_path.stat().st_mode) == 0o600
    assert [p.name for p in folder.iterdir() if p.name not in ("token", "token.tmp")] == [], \
        "a temporary file was left behind"


@pytest.mark.parametrize("folder_mode", [0o777, 0o770, 0o1777])
def test_a_token_folder_others_can_write_is_refused(tmp_path, folder_mode):
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(folder_mode)
    with pytest.raises(ValueError) as refused:
        auth.ensure_token_file(folder / "token", None)
    assert str(folder) in str(refused.value) and "chmod 700" in str(refused.value)
    assert not (folder / "token").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_token_folder_of_another_user_is_refused(tmp_path):
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, 4242, 4242)
    with pytest.raises(ValueError) as refused:
        auth.ensure_token_file(folder / "token", None)
    assert str(folder) in str(refused.value) and "4242" in str(refused.value)


def test_serve_refuses_a_token_folder_others_can_write(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o777)
    env = serve_env(tmp_path, SIDECAR_TOKEN_FILE=str(folder / "token"))
    result = subprocess.run([sys.executable, "-m", "sidecar.cli", "serve", "--port", "0",
                             "--trace-dir", str(tmp_path / "traces")],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 2, result.stderr
    assert str(folder) in result.stderr and "SIDECAR_TOKEN_FILE" in result.stderr
    assert "Traceback" not in result.stderr and not (folder / "token").exists()
