"""tests/file_order.py: the suite's files go to the xdist workers longest first."""

from __future__ import annotations

from tests import file_order
from tests.file_order import longest_files_first, table_from_junit


def test_files_go_longest_first_and_keep_their_own_order_and_ties(monkeypatch):
    monkeypatch.setattr(file_order, "FILE_SECONDS", {"tests/b.py": 50, "tests/c.py": 300})
    ids = ["tests/a.py::t1", "tests/b.py::t1", "tests/a.py::t2", "tests/c.py::t[1]", "tests/d.py::t",
           "tests/c.py::t[0]", "tests/b.py::t2"]
    assert longest_files_first(ids) == ["tests/c.py::t[1]", "tests/c.py::t[0]", "tests/b.py::t1", "tests/b.py::t2",
                                        "tests/a.py::t1", "tests/a.py::t2", "tests/d.py::t"]


def test_the_table_sums_a_junit_files_times_per_file(tmp_path):
    junit = tmp_path / "j.xml"
    junit.write_text('<testsuites><testsuite>'
                     '<testcase classname="tests.unit.test_x" name="a" time="8.5"/>'
                     '<testcase classname="tests.unit.test_x" name="b" time="4"/>'
                     '<testcase classname="tests.functional.test_y" name="c" time="30.2"/>'
                     '<testcase classname="tests.unit.test_z" name="d" time="1"/>'
                     '</testsuite></testsuites>')
    table = table_from_junit(str(junit))
    assert table.splitlines() == ["FILE_SECONDS = {", '    "tests/functional/test_y.py": 30,',
                                  '    "tests/unit/test_x.py": 12,', "}"]


def test_every_listed_file_exists():
    from pathlib import Path
    root = Path(file_order.__file__).resolve().parents[1]
    assert [f for f in file_order.FILE_SECONDS if not (root / f).is_file()] == []


def test_the_cpu_table_sums_each_files_tests_costliest_first(tmp_path):
    log = tmp_path / "cpu.jsonl"
    log.write_text('{"id": "tests/unit/test_x.py::a", "wall": 9.0, "cpu": 2.0}\n'
                   '{"id": "tests/unit/test_x.py::b[1]", "wall": 1.0, "cpu": 1.5}\n'
                   '{"id": "tests/functional/test_y.py::c", "wall": 20.0, "cpu": 30.0}\n')
    lines = file_order.cpu_table(str(log)).splitlines()
    assert lines[1].split() == ["30.0", "20.0", "tests/functional/test_y.py"]
    assert lines[2].split() == ["3.5", "10.0", "tests/unit/test_x.py"]
    assert lines[-1].split() == ["33.5", "30.0", "total"]
