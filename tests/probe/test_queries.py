"""The probe's answers to the sidecar's queries (sidecar/probe/queries.py), off the step thread."""

import threading


def test_a_recorder_dump_deletes_the_earlier_ones_of_its_process_the_sidecar_never_took(tmp_path):
    from sidecar.probe.queries import QueryAnswerer
    from sidecar.common.protocol import Query

    sent = []
    done = threading.Event()
    folder = tmp_path / "recorder"
    folder.mkdir()
    (folder / "worker-pid1-q3.json").write_text("{}")  # an earlier query's, never read
    (folder / "worker-pid1-q4.json.tmp").write_text("{")  # a write cut short
    (folder / "engine_core-pid2-q3.json").write_text("{}")  # another process's: not ours to delete
    answerer = QueryAnswerer(send=lambda a: (sent.append(a), done.set()), recorder_dump=lambda s: {"gc": {}},
                             recorder_file=lambda q: str(folder / f"worker-pid1-q{q}.json"),
                             step_thread_id=lambda: None, in_flight=None)
    answerer.answer(Query(query_id=5, kind="recorder", seconds=60))
    assert done.wait(10)
    assert sent[0].file == str(folder / "worker-pid1-q5.json") and sent[0].error is None
    assert sorted(p.name for p in folder.iterdir()) == ["engine_core-pid2-q3.json", "worker-pid1-q5.json"]
