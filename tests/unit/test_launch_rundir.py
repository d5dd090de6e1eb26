"""The run directory contract (launch/rundir.py): creation, latest, atomic state, bounded files."""

import json
import os
import subprocess
import sys

import pytest

from launch.rundir import (BoundedJsonl, EventLog, RotatingLog, RunState, create_run_dir, process_alive,
                           rank_log_path, read_jsonl, read_state, resolve_run_dir, tail_lines)
from wizard.errors import InputError


def test_create_points_latest_and_resolves(tmp_path):
    root = tmp_path / "runs"
    a = create_run_dir(root=root)
    b = create_run_dir(root=root)
    assert a != b and a.parent == root
    (b / "run.json").write_text("{}")
    assert (root / "latest").resolve() == b
    assert resolve_run_dir(None, root) == b
    assert resolve_run_dir(str(root)) == b              # a runs root means its latest
    assert resolve_run_dir(b.name, root) == b           # a run id under the root
    (a / "run.json").write_text("{}")
    assert resolve_run_dir(str(a)) == a


def test_explicit_run_dir_must_be_new_or_empty(tmp_path):
    d = create_run_dir(tmp_path / "deep" / "r1")
    assert d.is_dir() and (tmp_path / "deep" / "latest").resolve() == d
    (d / "x").write_text("x")
    with pytest.raises(InputError):
        create_run_dir(d)


def test_resolve_missing_run_is_input_error(tmp_path):
    with pytest.raises(InputError) as e:
        resolve_run_dir(None, tmp_path)
    assert "RUN_DIR" in str(e.value)


def test_run_state_replaced_atomically(tmp_path):
    st = RunState(tmp_path, {"id": "x", "status": "starting"})
    st.save()
    st.update(status="running", pids={"0": 123})
    assert read_state(tmp_path) == {"id": "x", "status": "running", "pids": {"0": 123}}
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]


def test_jsonl_keeps_newest_whole_lines_under_cap(tmp_path):
    path = tmp_path / "events.jsonl"
    ev = EventLog(path, cap_bytes=4000)
    for i in range(500):
        ev.emit("train_log", 1, loss=float(i), step=i)
    assert path.stat().st_size <= 4000
    rows = read_jsonl(path)
    assert rows and rows[-1]["step"] == 499
    steps = [r["step"] for r in rows]
    assert steps == list(range(steps[0], 500))          # contiguous newest, no torn lines
    assert ev.rotations > 0


def test_bounded_jsonl_keeps_exactly_the_newest_part_when_the_cut_falls_on_a_line_start(tmp_path):
    path = tmp_path / "m.jsonl"
    j = BoundedJsonl(path, cap_bytes=110)            # 10 lines of 11 bytes fill it
    for i in range(11):
        j.append({"n": f"{i:02d}"})                  # '{"n":"07"}\n': 11 bytes
    # the newest half (55 bytes) is five whole lines, the last one the line that did not fit
    assert [r["n"] for r in read_jsonl(path)] == ["06", "07", "08", "09", "10"]
    assert path.stat().st_size == 55 and j.rotations == 1


def test_bounded_jsonl_appends_whole_objects(tmp_path):
    j = BoundedJsonl(tmp_path / "m.jsonl", cap_bytes=10_000)
    j.append({"a": 1})
    j.append({"b": [1, 2]})
    assert [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()] == [{"a": 1}, {"b": [1, 2]}]


def test_rotating_log_keeps_one_backup(tmp_path):
    path = rank_log_path(tmp_path, 1, 0)
    log = RotatingLog(path, cap_bytes=1000)
    for i in range(100):
        log.write(b"%05d........................\n" % i)
    log.close()
    backup = path.with_name(path.name + ".1")
    assert path.stat().st_size <= 1000 and backup.stat().st_size <= 1000
    assert path.read_bytes().splitlines()[-1].startswith(b"00099")
    assert log.rotations >= 2


def test_tail_lines(tmp_path):
    p = tmp_path / "f.log"
    p.write_text("".join(f"l{i}\n" for i in range(100)))
    assert tail_lines(p, 3) == ["l97", "l98", "l99"]
    assert tail_lines(tmp_path / "missing", 3) == []


def test_process_alive_checks_the_recorded_start_time_and_never_raises(tmp_path):
    import psutil
    me = psutil.Process(os.getpid())
    assert process_alive(os.getpid()) and process_alive(str(os.getpid()), me.create_time())
    assert not process_alive(os.getpid(), me.create_time() - 100)      # same pid, another process
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    assert not process_alive(child.pid)
    for pid, create_time in [(None, None), ("x", None), (0, None), (os.getpid(), "not a time")]:
        assert not process_alive(pid, create_time)


def test_read_state_ignores_a_run_json_that_is_not_an_object(tmp_path):
    (tmp_path / "run.json").write_text("[1, 2]")
    assert read_state(tmp_path) is None
