"""A recorder dump a local probe reports is read through safe_files (recorder_dump.read_dump): only the
file of this query's name in a ``recorder`` folder, never through a link, and deleted by its name there."""

from __future__ import annotations

import json
import os

import pytest

from sidecar.common.protocol import RECORDER_DIR
from sidecar.service.incidents.recorder_dump import read_dump


def test_the_dump_is_read_and_deleted(tmp_path):
    folder = tmp_path / RECORDER_DIR
    folder.mkdir()
    (folder / "q7.json").write_text(json.dumps({"steps": [1, 2]}))
    assert read_dump(str(folder / "q7.json"), "q7.json") == {"steps": [1, 2]}
    assert not (folder / "q7.json").exists()


def test_a_link_in_place_of_the_dump_is_not_followed_and_its_target_is_kept(tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"secret": True}))
    folder = tmp_path / RECORDER_DIR
    folder.mkdir()
    os.symlink(secret, folder / "q7.json")
    # The reported path resolves (through the link) to another name: refused by name before any open.
    with pytest.raises(ValueError):
        read_dump(str(folder / "q7.json"), "q7.json")
    # A link whose target has the expected name, in another recorder folder: the open does not follow it.
    other = tmp_path / "elsewhere" / RECORDER_DIR
    other.mkdir(parents=True)
    (other / "q8.json").write_text(json.dumps({"secret": True}))
    os.symlink(other / "q8.json", folder / "q8.json")
    with pytest.raises(ValueError):
        read_dump(str(folder / "q8.json"), "q8.json")
    assert json.loads((other / "q8.json").read_text()) == {"secret": True}
