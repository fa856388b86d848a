"""Issue 27, A: a restarted sidecar serves a capture's files only from the capture's own folder. A
planted ``capture.json`` (an absolute path, ``../``, a name the sidecar never writes) or a symbolic
link in the folder (planted before the restart, or swapped in while it runs) serves nothing but a
JSON 404, and never the file's bytes; the capture's genuine files are still served. A saved scan
that is a link is not read either."""

import json
import os
from urllib.parse import quote

import pytest

from sidecar.service.app import make_app

from test_restart_index import one_capture, settings

SECRET = b"TOP-SECRET: not a file of any capture"


async def finished_capture(aiohttp_client, tmp_path):
    """A real capture finished by one app, whose client is then closed: (its JSON, its folder, its
    merged trace's bytes)."""
    app = make_app(settings(tmp_path))
    client = await aiohttp_client(app)
    body = await one_capture(client, app, tmp_path / "traces")
    assert body["state"] == "done", body
    trace = await (await client.get(f"/profile/{body['id']}/trace")).read()
    await client.close()
    return body, tmp_path / "traces" / "captures" / body["id"], trace


def secret_at(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(SECRET)
    return path


def plant_file_name(folder, name):
    """Rewrite the saved capture.json as an attacker would: its process's ``file`` is ``name``."""
    saved = json.loads((folder / "capture.json").read_text())
    saved["processes"][0]["file"] = name
    (folder / "capture.json").write_text(json.dumps(saved))


async def assert_not_served(response, status=404):
    body = await response.read()
    assert response.status == status, body
    assert response.content_type == "application/json"
    assert SECRET not in body
    answer = json.loads(body)
    assert answer["error"] == {404: "not_found", 410: "gone"}[status] and answer["message"], answer


def planted_names(tmp_path, folder):
    """Each name a planted capture.json may give, with the secret it would reach."""
    absolute = secret_at(tmp_path / "elsewhere" / "secret.txt")
    secret_at(folder.parent.parent / "etc" / "passwd")  # where ../../etc/passwd leads from the folder
    secret_at(folder / "notes.txt")  # in the folder, but no name the sidecar writes
    return {
        "absolute path": str(absolute),
        "../../etc/passwd": "../../etc/passwd",
        "dot-dot to the secret": "../../../elsewhere/secret.txt",
        "name not written": "notes.txt",
        "the capture's own capture.json": "capture.json",
        "a trace name without its suffix": "worker-rank0-pid7.json",
    }


@pytest.mark.parametrize("case", [
    "absolute path", "../../etc/passwd", "dot-dot to the secret", "name not written",
    "the capture's own capture.json", "a trace name without its suffix"])
async def test_a_planted_file_name_is_not_served(aiohttp_client, tmp_path, case):
    first, folder, trace = await finished_capture(aiohttp_client, tmp_path)
    name = planted_names(tmp_path, folder)[case]
    plant_file_name(folder, name)

    client = await aiohttp_client(make_app(settings(tmp_path)))
    await assert_not_served(await client.get(f"/profile/{first['id']}/files/{quote(name, safe='')}"))
    status = await client.get(f"/profile/{first['id']}")
    assert status.status == 200
    body = await status.json()
    assert body["processes"][0]["file"] is None and name not in body["files"], body
    assert any("processes[0].file" in note and "not served" in note for note in body["notes"]), body["notes"]
    # The capture's genuine files are still served.
    got = await client.get(f"/profile/{first['id']}/trace")
    assert got.status == 200 and await got.read() == trace
    assert (await client.get(f"/profile/{first['id']}/summary")).status == 200


async def test_a_symbolic_link_planted_before_the_restart_is_not_served(aiohttp_client, tmp_path):
    first, folder, _ = await finished_capture(aiohttp_client, tmp_path)
    secret = secret_at(tmp_path / "elsewhere" / "secret.txt")
    [process_file] = [name for name in first["files"] if name != "trace.json.gz"]
    for name in (process_file, "trace.json.gz", "summary.json"):
        (folder / name).unlink()
        (folder / name).symlink_to(secret)

    client = await aiohttp_client(make_app(settings(tmp_path)))
    body = await (await client.get(f"/profile/{first['id']}")).json()
    assert body["files"] == {} and body["trace"] is None and body["summary"] is None, body
    assert len([n for n in body["notes"] if "symbolic link" in n]) == 3, body["notes"]
    await assert_not_served(await client.get(f"/profile/{first['id']}/files/{process_file}"))
    await assert_not_served(await client.get(f"/profile/{first['id']}/trace"))
    await assert_not_served(await client.get(f"/profile/{first['id']}/summary"))
    await assert_not_served(await client.get(f"/profile/{first['id']}/report", headers={"Accept": "application/json"}))


async def test_a_symbolic_link_swapped_in_while_running_is_not_followed(aiohttp_client, tmp_path):
    first, folder, _ = await finished_capture(aiohttp_client, tmp_path)
    secret = secret_at(tmp_path / "elsewhere" / "secret.txt")
    client = await aiohttp_client(make_app(settings(tmp_path)))
    [process_file] = [name for name in first["files"] if name != "trace.json.gz"]
    assert (await client.get(f"/profile/{first['id']}/files/{process_file}")).status == 200

    for name in (process_file, "trace.json.gz", "summary.json"):  # after the restore's own checks
        (folder / name).unlink()
        (folder / name).symlink_to(secret)
    await assert_not_served(await client.get(f"/profile/{first['id']}/files/{process_file}"))
    await assert_not_served(await client.get(f"/profile/{first['id']}/trace"))
    await assert_not_served(await client.get(f"/profile/{first['id']}/summary"))

    (folder / "trace.json.gz").unlink()  # a file removed is gone (410), not missing
    await assert_not_served(await client.get(f"/profile/{first['id']}/trace"), status=410)


async def test_a_capture_folder_that_is_a_symbolic_link_is_ignored(aiohttp_client, tmp_path):
    first, folder, _ = await finished_capture(aiohttp_client, tmp_path)
    elsewhere = tmp_path / "elsewhere-capture"
    folder.rename(elsewhere)
    folder.symlink_to(elsewhere, target_is_directory=True)
    before = sorted(os.listdir(elsewhere))

    client = await aiohttp_client(make_app(settings(tmp_path)))
    assert (await (await client.get("/profiles")).json())["captures"] == []
    await assert_not_served(await client.get(f"/profile/{first['id']}/trace"))
    assert sorted(os.listdir(elsewhere)) == before, "nothing of the link's target is deleted"


async def test_a_capture_json_of_the_wrong_shape_does_not_stop_the_sidecar(aiohttp_client, tmp_path):
    first, folder, _ = await finished_capture(aiohttp_client, tmp_path)
    saved = json.loads((folder / "capture.json").read_text())
    (folder / "capture.json").write_text(json.dumps({**saved, "processes": [1], "options": "x"}))

    client = await aiohttp_client(make_app(settings(tmp_path)))
    body = await (await client.get(f"/profile/{first['id']}")).json()
    assert body["state"] == "failed" and body["files"] == {}, body


async def test_a_saved_scan_that_is_a_symbolic_link_is_not_read(aiohttp_client, tmp_path):
    """Scans and module timings serve no file, only their saved JSON: a link in its place is not
    followed (the link is removed as an unreadable save; what it points to is left alone)."""
    scans = tmp_path / "traces" / "scans"
    scans.mkdir(parents=True)
    scan_id = "s20250101-000000-000001"
    elsewhere = tmp_path / "elsewhere" / "scan.json"
    elsewhere.parent.mkdir()
    elsewhere.write_text(json.dumps({"id": scan_id, "state": "done", "steps": 2, "processes": []}))
    (scans / f"{scan_id}.json").symlink_to(elsewhere)

    client = await aiohttp_client(make_app(settings(tmp_path)))
    assert (await (await client.get("/syncs")).json())["scans"] == []
    await assert_not_served(await client.get(f"/sync/{scan_id}"))
    assert not (scans / f"{scan_id}.json").is_symlink() and elsewhere.is_file()
