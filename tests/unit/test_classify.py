"""Failure classification (launch/classify.py): pure, from exit codes and log evidence."""

from launch import classify as c

TORCHRUN_REPORT = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
fail.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-30_03:34:59
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 7933)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 7933
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_03:34:59
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 7934)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
""".splitlines()


def test_decode_exit_codes():
    assert c.decode_exit(-9) == (None, 9)
    assert c.decode_exit(137) == (137, 9)
    assert c.decode_exit(1) == (1, None)
    assert c.decode_exit(0) == (0, None)
    assert c.shell_exit_code(-15) == 143 and c.shell_exit_code(3) == 3
    assert c.signal_name(6) == "SIGABRT"


def test_parse_torchrun_report():
    f = c.parse_torchrun_failures(TORCHRUN_REPORT)
    by_rank = {x["rank"]: x for x in f}
    assert by_rank[1]["exit_code"] == 1 and by_rank[1]["root_cause"] and by_rank[1]["pid"] == 7934
    assert by_rank[0]["exit_code"] == -15 and not by_rank[0]["root_cause"]


def test_parse_simple_launcher():
    assert c.parse_simple_launcher_exit(
        ["subprocess.CalledProcessError: Command '['python', 'x.py']' returned non-zero exit status 3."]) == 3
    assert c.parse_simple_launcher_exit(
        ["subprocess.CalledProcessError: Command '['python']' died with <Signals.SIGKILL: 9>."]) == -9
    assert c.parse_simple_launcher_exit(["all good"]) is None


def test_python_exception_first_rank_and_collateral():
    tail = ["Traceback (most recent call last):", "RuntimeError: deliberate failure on rank 1"]
    o = c.AttemptOutcome(launcher_exit=1, ranks=[
        c.RankOutcome(rank=0, exit_code=-15, ended_at=12.0, log_tail=["step 3"]),
        c.RankOutcome(rank=1, exit_code=1, ended_at=11.0, traceback_at=10.5,
                      last_exception="RuntimeError: deliberate failure on rank 1", log_tail=tail),
    ])
    r = c.classify(o)
    assert r.kind == "python_exception" and r.rank == 1 and r.exit_code == 1
    assert "RuntimeError" in r.summary and "rank 0" in r.summary
    assert r.log_tail == tail


def test_earliest_failure_wins_among_two_exceptions():
    o = c.AttemptOutcome(launcher_exit=1, ranks=[
        c.RankOutcome(rank=0, exit_code=1, traceback_at=20.0, last_exception="ValueError: late"),
        c.RankOutcome(rank=3, exit_code=1, traceback_at=10.0, last_exception="KeyError: early"),
    ])
    assert c.classify(o).rank == 3


def test_nccl_abort():
    o = c.AttemptOutcome(launcher_exit=1, ranks=[
        c.RankOutcome(rank=2, exit_code=-6, nccl_at=50.0),
        c.RankOutcome(rank=0, exit_code=-15, ended_at=51.0)])
    r = c.classify(o)
    assert r.kind == "nccl_abort" and r.rank == 2 and r.signal == "SIGABRT"
    assert "Flight Recorder" in r.hint


def test_sigabrt_without_nccl_text_is_a_signal():
    r = c.classify(c.AttemptOutcome(launcher_exit=1, ranks=[c.RankOutcome(rank=0, exit_code=-6)]))
    assert r.kind == "signal" and r.signal == "SIGABRT"


def test_oom_killer_unless_stop_requested():
    ranks = [c.RankOutcome(rank=1, exit_code=-9, ended_at=3.0), c.RankOutcome(rank=0, exit_code=-15, ended_at=4.0)]
    r = c.classify(c.AttemptOutcome(launcher_exit=1, ranks=ranks, oom_killer_seen=True))
    assert r.kind == "oom_killed" and r.rank == 1 and "kernel log confirms" in r.hint
    assert c.classify(c.AttemptOutcome(launcher_exit=1, ranks=ranks, stop_requested=True)) is None


def test_only_collateral_is_reported_as_collateral():
    r = c.classify(c.AttemptOutcome(launcher_exit=1, ranks=[c.RankOutcome(rank=0, exit_code=-15)]))
    assert r.kind == "collateral"


def test_clean_exit_and_launcher_only_failure():
    assert c.classify(c.AttemptOutcome(launcher_exit=0, ranks=[c.RankOutcome(rank=0, exit_code=0)])) is None
    r = c.classify(c.AttemptOutcome(launcher_exit=2, launcher_tail=["error: bad config"]))
    assert r.kind == "unknown" and r.rank is None and r.log_tail == ["error: bad config"]


def test_stall_names_silent_ranks():
    o = c.AttemptOutcome(launcher_exit=None, stalled=True, stall_timeout_s=10, stall_now=100.0,
                         ranks=[c.RankOutcome(rank=0, last_output_at=85.0), c.RankOutcome(rank=1, last_output_at=60.0)])
    r = c.classify(o)
    assert r.kind == "stall" and r.rank == 1
    assert "rank 1: silent 40 s" in r.hint and "py-spy" in r.hint


def test_cuda_oom_suggests_next_rung_from_config():
    ds = {"zero_optimization": {"stage": 2}}
    name, cmd = c.suggest_for_cuda_oom(None, {"distributed_type": "DEEPSPEED"}, ds)
    assert name == "DeepSpeed ZeRO-3"
    assert cmd == "wizard --non-interactive --backend deepspeed --zero-stage 3 --offload none"
    name, cmd = c.suggest_for_cuda_oom(None, {"distributed_type": "DEEPSPEED"},
                                       {"zero_optimization": {"stage": 3}})
    assert "--offload cpu" in cmd and "optimizer offload" in name
    name, _ = c.suggest_for_cuda_oom(None, {"distributed_type": "MULTI_GPU"}, None)
    assert name == "DeepSpeed ZeRO-2"
    o = c.AttemptOutcome(launcher_exit=1, next_rung=name, suggested_command=_,
                         ranks=[c.RankOutcome(rank=0, exit_code=1, cuda_oom_at=1.0, traceback_at=1.0)])
    r = c.classify(o)
    assert r.kind == "cuda_oom" and r.next_rung == "DeepSpeed ZeRO-2" and "--zero-stage 2" in r.suggested_command


def test_cuda_oom_follows_the_saved_plan():
    plan = {"choice": {"key": "zero2"}, "rungs": [
        {"key": "ddp", "name": "DDP", "backend": "ddp"},
        {"key": "zero2", "name": "ZeRO-2", "backend": "deepspeed", "zero_stage": 2},
        {"key": "zero3", "name": "ZeRO-3 + checkpointing", "backend": "deepspeed", "zero_stage": 3,
         "gradient_checkpointing": True, "offload_optimizer": "none", "offload_param": "none"}]}
    name, cmd = c.suggest_for_cuda_oom(plan, {"distributed_type": "DEEPSPEED"}, None)
    assert name == "ZeRO-3 + checkpointing"
    assert cmd.endswith("--zero-stage 3 --offload none --gradient-checkpointing on")


def test_fsdp_ladder():
    acc = {"distributed_type": "FSDP", "fsdp_config": {"fsdp_reshard_after_forward": False}}
    # the plan's own key (classify once said "fsdp" where the plan said "fsdp-noreshard") and the plan's label
    assert c.current_rung_key(acc, None) == "fsdp-noreshard"
    name, cmd = c.suggest_for_cuda_oom(None, acc, None)
    assert name == "FSDP2 with resharding (~ZeRO-3)" and cmd == "wizard --non-interactive --backend fsdp --offload none"


def test_saved_plan_file_shape_and_fallback_to_ladder():
    # wizard_plan.json nests the plan; a forced backend leaves one rung: fall back to DESIGN's ladder
    saved = {"given": {}, "model": {}, "plan": {"choice": {"key": "zero3"}, "rungs": [
        {"key": "zero3", "name": "DeepSpeed ZeRO-3", "backend": "deepspeed", "zero_stage": 3, "fits": True}]}}
    name, cmd = c.suggest_for_cuda_oom(saved, {"distributed_type": "DEEPSPEED"}, {"zero_optimization": {"stage": 3}})
    assert name == "ZeRO-3 + CPU optimizer offload" and "--offload cpu" in cmd
    # the plan's rule: the first later rung that fits
    saved["plan"]["choice"]["key"] = "ddp"
    saved["plan"]["rungs"] = [{"key": "ddp", "name": "DDP", "backend": "ddp", "fits": True},
                              {"key": "zero2", "name": "ZeRO-2", "backend": "deepspeed", "zero_stage": 2, "fits": False},
                              {"key": "zero3", "name": "ZeRO-3", "backend": "deepspeed", "zero_stage": 3, "fits": True}]
    name, _ = c.suggest_for_cuda_oom(saved, {"distributed_type": "MULTI_GPU"}, None)
    assert name == "ZeRO-3"


# ------------------------------------------------------------------ issue 11

def test_a_sigkill_is_an_oom_kill_only_when_the_kernel_log_says_so():
    ranks = [c.RankOutcome(rank=1, exit_code=-9, ended_at=3.0), c.RankOutcome(rank=0, exit_code=-15, ended_at=4.0)]
    unknown = c.classify(c.AttemptOutcome(launcher_exit=1, ranks=ranks, oom_killer_seen=None))
    assert unknown.kind == "signal" and unknown.rank == 1
    assert unknown.summary.startswith("rank 1 killed by signal 9 (cause unknown)") and "OOM" not in unknown.summary
    user = c.classify(c.AttemptOutcome(launcher_exit=1, ranks=ranks, oom_killer_seen=False))
    assert user.kind == "signal" and "not the OOM killer" in user.summary
    assert "sent by a user or another program" in user.hint and "likely" not in user.hint


def test_sigabrt_after_the_last_training_line_is_a_shutdown_crash_not_restarted():
    ranks = [c.RankOutcome(rank=1, exit_code=-6, ended_at=12.0), c.RankOutcome(rank=0, exit_code=0, ended_at=11.0)]
    r = c.classify(c.AttemptOutcome(launcher_exit=1, ranks=ranks, training_finished_at=10.0))
    assert r.kind == "shutdown_crash" and r.rank == 1 and r.exit_code == -6
    assert r.summary == "rank 1 crashed during shutdown after training finished (SIGABRT)"
    assert "shutdown_crash" in c.NOT_RESTARTED
    # the same abort before training finished is an ordinary signal death
    early = c.classify(c.AttemptOutcome(launcher_exit=1, ranks=ranks))
    assert early.kind == "signal"
    before = c.classify(c.AttemptOutcome(launcher_exit=1, ranks=[c.RankOutcome(rank=1, exit_code=134, ended_at=5.0)],
                                         training_finished_at=10.0))
    assert before.kind == "signal"
    assert "destroy_process_group" not in r.hint          # nothing in the log says why


def test_a_shutdown_crash_from_threads_at_exit_names_destroy_process_group():
    tail = ["{'train_runtime': 3.7, 'train_loss': 4.56, 'epoch': 0.01}", "terminate called without an active exception"]
    ranks = [c.RankOutcome(rank=0, exit_code=-6, ended_at=12.0, log_tail=tail)]
    r = c.classify(c.AttemptOutcome(launcher_exit=1, ranks=ranks, training_finished_at=10.0))
    assert r.kind == "shutdown_crash"
    assert "torch.distributed.destroy_process_group()" in r.hint


def test_the_trainer_summary_marks_the_end_of_training():
    from launch.logs import StreamCapture
    cap = StreamCapture(0, clock=lambda: 42.0)
    cap.feed(b"{'loss': 1.0, 'learning_rate': 0.1, 'epoch': 1.0}\n")
    assert cap.markers.train_done_at is None
    cap.feed(b"{'train_runtime': 3.2, 'train_samples_per_second': 9.9, 'train_loss': 1.1, 'epoch': 1.0}\n")
    assert cap.markers.train_done_at == 42.0


def _dump(main_frames: list[str]) -> list[str]:
    """A faulthandler dump as a rank writes it: a helper thread, then the main thread."""
    lines = ["Thread 0x00007f2b5d7fe640 (most recent call first):",
             '  File "/usr/lib/python3.11/threading.py", line 320 in wait', ""]
    lines.append("Current thread 0x00007f2b6c8a1740 (most recent call first):")
    lines += [f'  File "{f}", line 10 in {fn}' for f, fn in main_frames]
    lines += ['  File "/repo/launch/_worker.py", line 70 in main', '  File "/repo/launch/_worker.py", line 76 in <module>']
    return ["{'loss': 1.0}"] + lines


def test_main_thread_stack_is_the_one_under_the_worker():
    stack = c.main_thread_stack(_dump([("/repo/examples/train.py", "on_step_begin")]))
    assert stack[0] == "on_step_begin (/repo/examples/train.py:10)" and stack[-1].startswith("<module>")
    assert c.waiting_for_others(stack) is False
    assert c.main_thread_stack(["no dump here"]) is None and c.waiting_for_others(None) is None


def test_the_stalled_rank_is_the_one_not_waiting_with_the_others():
    """Rank 1 hangs in a callback; rank 0 waits for it in the gradient all-reduce. Rank 0's last line
    is older (rank 1 printed 'hanging'), yet the stall is rank 1's."""
    waiting = c.main_thread_stack(_dump([("/venv/torch/autograd/graph.py", "_engine_run_backward"),
                                         ("/venv/torch/_tensor.py", "backward")]))
    hung = c.main_thread_stack(_dump([("/repo/examples/train.py", "on_step_begin")]))
    o = c.AttemptOutcome(launcher_exit=None, stalled=True, stall_timeout_s=20, stall_now=100.0, ranks=[
        c.RankOutcome(rank=0, last_output_at=70.0, stack=waiting),
        c.RankOutcome(rank=1, last_output_at=71.0, stack=hung)])
    r = c.classify(o)
    assert r.kind == "stall" and r.rank == 1
    assert "rank 1 stalled at on_step_begin" in r.summary and "rank 0 waits for it" in r.hint
    # without stacks: the rank silent longest, as before
    o.ranks[0].stack = o.ranks[1].stack = None
    assert c.classify(o).rank == 0


def test_cuda_oom_names_the_resume_of_this_run_on_the_next_rung_or_why_it_cannot():
    from launch.resume import refusal_across
    cmd = c.resume_command_for("/runs/r 1", "/cfg/default_config.yaml", "train.py", ["--steps", "8"])
    assert cmd == "wizard launch --resume '/runs/r 1' --config-file /cfg/default_config.yaml -- train.py --steps 8"
    oom = [c.RankOutcome(rank=0, exit_code=1, cuda_oom_at=1.0, traceback_at=1.0)]
    r = c.classify(c.AttemptOutcome(launcher_exit=1, next_rung="DeepSpeed ZeRO-3 + CPU optimizer offload",
                                    suggested_command="wizard --non-interactive --zero-stage 3 --offload cpu",
                                    resume_command=cmd, ranks=oom))
    assert r.resume_command == cmd and f"then `{cmd}` continues from this run's last complete checkpoint" in r.hint
    # ZeRO-2's next rung is ZeRO-3, where DeepSpeed cannot load ZeRO-2 checkpoints: the hint says so instead
    why = refusal_across({"distributed_type": "DEEPSPEED"}, {"zero_optimization": {"stage": 2}},
                         {"backend": "deepspeed", "zero_stage": 3})
    assert why and "DeepSpeed cannot load" in why
    assert refusal_across({"distributed_type": "DEEPSPEED"}, {"zero_optimization": {"stage": 3}},
                          {"backend": "deepspeed", "zero_stage": 3, "offload_optimizer": "cpu"}) is None
    r = c.classify(c.AttemptOutcome(launcher_exit=1, next_rung="DeepSpeed ZeRO-3", suggested_command="wizard ...",
                                    resume_command="CANNOT: " + why, ranks=oom))
    assert r.resume_command is None and "this run's checkpoints cannot continue there: DeepSpeed cannot" in r.hint
