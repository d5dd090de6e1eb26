"""A node's limits against what the run needs (issue 41): open files, processes, /dev/shm's free space and whether
it takes a file, and the checkpoint directory against the plan's plan.checkpoint.per_node_total_bytes (issue 39's
field; a plan without it is said to be unchecked), and where that directory is."""

from __future__ import annotations

import json

import pytest

from wizard.preflight import expect, limits, node
from wizard.preflight.checks import FAIL, INFO, OK, WARN, Expectation

GiB = 1 << 30


def exp(**kw) -> Expectation:
    base = dict(config_file="c.yaml", num_machines=2, processes_per_node=8, uses_gpus=True, main_ip="10.0.0.1",
                main_port=29500)
    base.update(kw)
    return Expectation(**base)


def test_a_128_open_files_limit_fails_with_the_fix_the_hard_limit_allows():
    row = limits.nofile_row(0, "n1", exp(), {"nofile": [128, 1048576]})
    assert row.status == FAIL and "ulimit -n 128 (hard 1048576)" in row.detail and "Too many open files" in row.detail
    assert row.fix.startswith("`ulimit -n 1048576`")
    capped = limits.nofile_row(0, "n1", exp(), {"nofile": [128, 512]})
    assert "raise the hard limit" in capped.fix
    assert limits.nofile_row(0, "n1", exp(), {"nofile": [1048576, 1048576]}).status == OK
    assert limits.nofile_row(0, "n1", exp(), {"nofile": [None, None]}).status == OK
    # at scale each rank needs a few more per rank of the world: 64 machines x 8 GPUs
    assert limits.nofile_row(0, "n1", exp(num_machines=64), {"nofile": [1024, 1024]}).status == FAIL


def test_processes_count_the_users_threads_and_a_cgroups_pids_limit():
    few = limits.nproc_row(0, "n1", exp(), {"nproc": [500, 500], "user_threads": 200})
    assert few.status == FAIL and "ulimit -u" in few.fix          # 200 + 8 ranks x 64 threads > 500
    assert limits.nproc_row(0, "n1", exp(), {"nproc": [500, 500], "user_threads": 200, "root": True}).status == OK
    assert limits.nproc_row(0, "n1", exp(), {"nproc": [None, None], "user_threads": 200}).status == OK
    pids = limits.nproc_row(0, "n1", exp(), {"nproc": [None, None], "pids": [1024, 900]})
    assert pids.status == FAIL and "pids" in pids.fix


@pytest.mark.parametrize("shm, several, status, words", [
    ({"total": 8 * GiB, "free": 0, "writable": False, "write_error": "No space left on device"}, True, FAIL,
     "No space left on device"),
    ({"total": 8 * GiB, "free": 0, "writable": False, "write_error": "No space left on device"}, False, WARN,
     "Bus error"),
    ({"total": 8 * GiB, "free": 100 << 20, "writable": True}, True, FAIL, "needs 256.0 MiB"),
    ({"total": 8 * GiB, "free": 100 << 20, "writable": True}, False, WARN, "run short"),
    ({"total": 8 * GiB, "free": 7 * GiB, "writable": True}, True, OK, "7.0 GiB free of 8.0 GiB"),
    ({"total": 8 * GiB, "free": 7 * GiB, "writable": False, "write_error": "Read-only file system"}, True, FAIL,
     "Read-only file system"),
])
def test_dev_shm_is_judged_by_its_free_space_and_whether_it_takes_a_file(shm, several, status, words):
    row = limits.shm_row(0, "n1", exp(processes_per_node=8 if several else 1), {"shm": shm})
    assert row.status == status and words in row.detail, row
    assert status == OK or row.fix


def plan_with_checkpoint(per_node_total: int) -> dict:
    return {"plan": {"choice": {"key": "zero2"}, "checkpoint": {
        "bytes": 4 * per_node_total, "per_node_bytes": per_node_total // 2, "keep": 2, "total_bytes": 8 * per_node_total,
        "per_node_total_bytes": per_node_total, "parts": 3}}}


def test_the_checkpoint_directory_is_checked_against_the_plans_per_node_total(tmp_path):
    cfg = tmp_path / "default_config.yaml"
    cfg.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nnum_machines: 2\n"
                   "num_processes: 2\nmain_process_ip: 127.0.0.1\nuse_cpu: true\n")
    (tmp_path / "wizard_plan.json").write_text(json.dumps(plan_with_checkpoint(300 * GiB)))
    e = expect.expectation(str(cfg), checkpoint_dir="/ckpt", checkpoint_dir_from="the training's --output_dir")
    assert e.checkpoint_bytes == 300 * GiB and e.checkpoint_dir == "/ckpt"
    space = {"path": "/ckpt", "at": "/ckpt", "total": 1 << 40, "free": 200 * GiB, "writable": True}
    row = limits.checkpoint_row(1, "n2", e, {"checkpoint": space})
    assert row.status == FAIL and "200.0 GiB free at /ckpt" in row.detail and "300.0 GiB" in row.detail
    assert "save_total_limit" in row.fix
    assert limits.checkpoint_row(1, "n2", e, {"checkpoint": {**space, "free": 400 * GiB}}).status == OK
    assert limits.checkpoint_row(1, "n2", e, {"checkpoint": {**space, "writable": False,
                                                             "write_error": "Read-only file system"}}).status == FAIL


def test_a_plan_without_the_checkpoint_figure_is_said_to_be_unchecked(tmp_path):
    assert expect.checkpoint_bytes({"plan": {"choice": {}}}) is None           # main's plans today
    assert expect.checkpoint_bytes(None) is None
    assert expect.checkpoint_bytes({"plan": {"checkpoint": {"per_node_total_bytes": "lots"}}}) is None
    row = limits.checkpoint_row(0, "n1", exp(), {"checkpoint": {"path": "/w", "at": "/w", "free": GiB,
                                                                 "writable": True}})
    assert row.status == INFO and "not checked" in row.detail and "per_node_total_bytes" in row.detail


@pytest.mark.parametrize("args, found", [
    (["--output_dir", "/ckpt/run1", "--steps", "2"], "/ckpt/run1"),
    (["--output-dir=out"], "out"),
    (["--steps", "2"], None),
    (["--output_dir"], None),
])
def test_the_trainers_output_dir_is_read_from_the_trainings_arguments(args, found):
    assert expect.output_dir(args) == found


def test_a_directory_that_does_not_exist_yet_is_judged_by_the_one_above(tmp_path):
    got = node.space(str(tmp_path / "out" / "run1"))
    assert got["at"] == str(tmp_path) and got["writable"] is True and got["free"] > 0 and got["total"] >= got["free"]


def test_a_trainingarguments_file_among_the_arguments_names_the_directory(tmp_path):
    from wizard.frontends.preflight_cli import training_output_dir
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"output_dir": "/ckpt/from-json", "per_device_train_batch_size": 1}))
    assert training_output_dir(["train.py", str(args)]) == ("/ckpt/from-json", f"output_dir in {args}")
    assert training_output_dir(["train.py", "--output_dir", "o"]) == ("o", "the training's --output_dir")
    assert training_output_dir(["train.py"]) == (None, None)
