"""Hand-made mutations that the suite must catch: each breaks the code on purpose and names the tests
that fail because of it (issue 15, "tests that pass with the code broken").

    python tests/mutants.py --list          # the mutants, what each breaks and the tests expected to fail
    python tests/mutants.py                 # apply each in a scratch copy of the checkout, run its tests
    python tests/mutants.py memory-nvme-not-per-node fsutil-bak-written-in-place

Nothing in the checkout changes: each mutant is applied to a copy (the files `git ls-files` knows, in a
temp dir) and its tests run there with PYTHONPATH on the copy. A mutant is "killed" when its tests
fail; a mutant whose text is no longer found exactly once in its file is reported "stale" (the code
moved: update the mutant, do not drop it). Exit status 1 when any mutant survives or is stale.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str                                # file the edits apply to, relative to the repo
    edits: tuple[tuple[str, str], ...]       # (text found exactly once, its replacement)
    tests: tuple[str, ...]                   # pytest node ids expected to fail
    breaks: str                              # what the mutation breaks, in words


LEFTOVER_TEST = "tests/functional/test_launch_trust.py::test_leftovers_after_the_launcher_exits_are_ended_with_sigkill"
REAPER_TEST = ("tests/functional/test_launch_trust.py::"
               "test_the_reaper_alone_ends_a_worker_that_ignores_sigterm_in_its_own_session")

MUTANTS = (
    # ---- memory breakdown (tests/unit/test_memory.py)
    Mutant("memory-zero2-grad32-as-optimizer", "wizard/sizing/memory.py",
           (("    gradients = int((sb.grad + FP32_GRAD_BYTES) * params / world)",
             "    gradients = int(sb.grad * params / world)"),),
           ("tests/unit/test_memory.py::test_zero_breakdowns_put_each_byte_under_its_own_label",),
           "ZeRO-2's fp32 gradient partition counted as optimizer bytes (the sum stays right)"),
    Mutant("memory-zero3-grad16-as-optimizer", "wizard/sizing/memory.py",
           (("gradients = layer_grads + int(zero3_grad_partition_bytes(precision) * params / world)",
             "gradients = layer_grads"),
            ("optimizer_bytes = int((FP32_MASTER_BYTES + sb.optim) * params / world)",
             "optimizer_bytes = int((FP32_MASTER_BYTES + sb.optim + zero3_grad_partition_bytes(precision)) * params"
             " / world)")),
           ("tests/unit/test_memory.py::test_zero_breakdowns_put_each_byte_under_its_own_label",),
           "ZeRO-3's 16-bit gradient partition counted as optimizer bytes (the sum stays right)"),
    Mutant("memory-zero1-world-ignores-nodes", "wizard/sizing/memory.py",
           (("    world = num_gpus_per_node * num_nodes\n    k = FP32_MASTER_BYTES",
             "    world = num_gpus_per_node\n    k = FP32_MASTER_BYTES"),),
           ("tests/unit/test_memory.py::test_zero1_shards_the_optimizer_over_every_gpu_of_every_machine",
            "tests/unit/test_memory.py::test_zero_breakdowns_put_each_byte_under_its_own_label"),
           "ZeRO-1 shards the optimizer over one machine's GPUs only"),
    Mutant("memory-nvme-not-per-node", "wizard/sizing/memory.py",
           (("nvme = int(params * (param16 + FP32_MASTER_BYTES + sb.optim) * gpus_factor)",
             "nvme = int(params * (param16 + FP32_MASTER_BYTES + sb.optim))"),),
           ("tests/unit/test_memory.py::test_nvme_states",),
           "every machine's NVMe holds the whole model's swapped states"),
    # ---- adapter sizing and its cache (tests/unit/test_adapter_cache.py)
    Mutant("adapters-key-ignores-peft-version", "wizard/sizing/adapters.py",
           (('_LIBRARIES = ("transformers", "torch", "peft")', '_LIBRARIES = ("transformers", "torch")'),),
           ("tests/unit/test_adapter_cache.py::test_the_key_changes_with_config_options_versions_and_code",),
           "adapter counts cached under one peft version are read back under another"),
    Mutant("model-built-model-handed-twice", "wizard/sizing/model.py",
           (("    found, _LAST_BUILT = _LAST_BUILT, None\n", "    found = _LAST_BUILT\n"),),
           ("tests/unit/test_adapter_cache.py::test_the_first_adapter_sizing_uses_the_model_size_model_built"
            "[llama-tiny]",),
           "a second method is sized on the model peft already wrapped for the first"),
    Mutant("lora-bitsandbytes-not-hidden", "wizard/sizing/lora.py",
           (('    hide = "bitsandbytes" not in sys.modules\n', "    hide = False\n"),),
           ("tests/unit/test_adapter_cache.py::test_sizing_never_imports_bitsandbytes_and_leaves_it_importable",),
           "sizing adapters imports bitsandbytes (0.8 s and torch._inductor) through peft"),
    Mutant("lora-peft-leaves-the-model-in-the-slot", "wizard/sizing/lora.py",
           (("            if found is not None:\n                take_built(data, config_path)\n", ""),),
           ("tests/unit/test_adapter_cache.py::test_the_first_adapter_sizing_uses_the_model_size_model_built"
            "[llama-tiny]",),
           "a method sized by peft leaves the model it wrapped for the next method's count"),
    Mutant("lora-count-forgets-lora-b", "wizard/sizing/lora.py",
           (("            size = module.in_features + module.out_features\n",
             "            size = module.in_features\n"),),
           ("tests/unit/test_lora_count.py::test_count_equals_peft_on_the_fixtures[llama-tiny-None]",),
           "adapters counted from the shapes leave out lora_B (out x r)"),
    Mutant("lora-count-takes-any-module", "wizard/sizing/lora.py",
           (("        else:\n            return None\n        trainable += options.rank * size\n",
             "        else:\n            size = sum(module.weight.shape)\n        trainable += options.rank * size\n"),),
           ("tests/unit/test_lora_count.py::test_what_is_left_to_peft",),
           "a targeted Embedding is counted as if it were a Linear instead of by peft"),
    # ---- atomic writes (tests/unit/test_fsutil.py)
    Mutant("fsutil-temp-in-tmpdir", "wizard/fsutil.py",
           (("fd, tmp = tempfile.mkstemp(dir=directory, prefix=", "fd, tmp = tempfile.mkstemp(prefix="),),
           ("tests/unit/test_fsutil.py::test_every_temp_file_is_made_in_the_target_directory",),
           "replace_file stages in $TMPDIR: the rename crosses file systems"),
    Mutant("fsutil-set-temp-in-tmpdir", "wizard/fsutil.py",
           (('tempfile.mkstemp(dir=self.directory, prefix=f".{name}{STAGE_MARK}"',
             'tempfile.mkstemp(prefix=f".{name}{STAGE_MARK}"'),),
           ("tests/unit/test_fsutil.py::test_every_temp_file_is_made_in_the_target_directory",),
           "a set write stages in $TMPDIR"),
    Mutant("fsutil-replace-before-bak", "wizard/fsutil.py",
           (("    replace_file(backup, old, mode=mode)\n    replace_file(path, text, mode=mode)\n",
             "    replace_file(path, text, mode=mode)\n    replace_file(backup, old, mode=mode)\n"),),
           ("tests/unit/test_fsutil.py::test_write_atomic_keeps_the_old_content_in_bak_before_replacing_the_file",),
           "write_atomic replaces the file before its .bak exists (a crash in between loses the old content)"),
    Mutant("fsutil-set-keeps-original-after-rename", "wizard/fsutil.py",
           (("                self._originals[path] = self._keep(path)\n", ""),
            ("        self._undo.append(_Undo(target, previous))\n",
             "        self._undo.append(_Undo(target, previous))\n"
             "        if self.results.get(target) and self.results[target].backup_path and target not in self._originals:\n"
             "            self._originals[target] = self._keep(target)\n")),
           ("tests/unit/test_fsutil.py::test_write_files_keeps_bak_only_for_what_really_changed",),
           "a set write keeps the file for its .bak only after the new one replaced it"),
    Mutant("fsutil-bak-written-in-place", "wizard/fsutil.py",
           (("    replace_file(backup, old, mode=mode)\n",
             "    with open(backup, 'w', encoding='utf-8') as f:\n        f.write(old)\n"),),
           ("tests/unit/test_fsutil.py::test_a_bak_is_replaced_whole_never_rewritten_in_place",),
           "write_atomic rewrites .bak in place (a reader or a crash sees it half written)"),
    Mutant("fsutil-set-bak-written-in-place", "wizard/fsutil.py",
           (("            self._place(self._keep(original), target + BACKUP_SUFFIX)\n",
             "            with open(original, 'rb') as src, open(target + BACKUP_SUFFIX, 'wb') as dst:\n"
             "                dst.write(src.read())\n"),),
           ("tests/unit/test_fsutil.py::test_a_bak_is_replaced_whole_never_rewritten_in_place",),
           "a set write rewrites .bak in place"),
    Mutant("fsutil-lock-trusts-unlinked-file", "wizard/fsutil.py",
           (("                same = os.stat(path).st_ino == os.fstat(fd).st_ino\n", "                same = True\n"),),
           ("tests/unit/test_fsutil.py::test_a_waiter_that_locked_a_file_already_unlinked_locks_the_new_one",),
           "dir_lock goes ahead on a lock file the previous holder already unlinked (two writers at once)"),
    # ---- the fit rule (tests/unit/test_plan.py)
    # The fit decision (evaluate._problems) and the searches (fit._slack) live apart since the
    # split of plan.py: one mutant each.
    Mutant("plan-fit-ignores-headroom", "wizard/planning/evaluate.py",
           (("    if est.per_gpu > x.usable:\n", "    if est.per_gpu > x.capacity:\n"),),
           ("tests/unit/test_plan.py::test_a_rung_fits_only_within_the_capacity_less_the_headroom",),
           "a rung fits when its estimate is within the whole GPU, headroom ignored"),
    Mutant("plan-batch-search-ignores-headroom", "wizard/planning/fit.py",
           (("    slack = min(x.usable - est.per_gpu, x.usable - est.load)\n",
             "    slack = min(x.capacity - est.per_gpu, x.usable - est.load)\n"),),
           ("tests/unit/test_plan.py::test_a_rung_fits_only_within_the_capacity_less_the_headroom",),
           "the largest micro-batch that fits is searched within the whole GPU, headroom ignored"),
    # ---- check rules: near misses and severity (tests/unit/test_check_rules.py)
    Mutant("check-odd-allgather-on-stage3", "wizard/check/rules/deepspeed_json.py",
           (("ctx.zero_stage() not in (1, 2):\n", "ctx.zero_stage() not in (1, 2, 3):\n"),),
           ("tests/unit/test_check_rules.py::test_an_odd_allgather_bucket_is_fine_under_zero3_which_never_reads_it",),
           "the odd all-gather bucket rule fires under ZeRO-3, which never reads the key"),
    Mutant("check-float-bucket-flags-whole-floats", "wizard/check/rules/deepspeed_json.py",
           (("math.isfinite(v) and not v.is_integer()]", "math.isfinite(v)]"),),
           ("tests/unit/test_check_rules.py::test_a_whole_float_bucket_is_accepted_as_deepspeed_accepts_it",),
           "a whole float such as 5e8, which DeepSpeed accepts, is reported as a fractional bucket size"),
    Mutant("check-warning-turned-error", "wizard/check/rules/deepspeed_json.py",
           (('"warning", "DS-ZERO3-NO-16BIT-SAVE"', '"error", "DS-ZERO3-NO-16BIT-SAVE"'),),
           ("tests/unit/test_check_rules.py::test_each_rule_reports_its_trigger_with_its_own_severity",),
           "a warning (ZeRO-3 without a 16-bit save) is raised as an error"),
    Mutant("check-gpu-ids-off-by-one", "wizard/check/gpu_fit.py",
           (("(i.isdigit() and int(i) < gpus)]", "(i.isdigit() and int(i) <= gpus)]"),),
           ("tests/unit/test_check_near_misses.py::test_gpu_ids_must_name_gpus_below_the_count",),
           "gpu_ids naming GPU N on an N-GPU machine is accepted"),
    Mutant("check-split-batches-skips-two-processes", "wizard/check/rules/integration.py",
           (("if batch is None or procs <= 1 or batch % procs == 0:",
             "if batch is None or procs <= 2 or batch % procs == 0:"),),
           ("tests/unit/test_check_near_misses.py::test_split_batches_must_divide_by_every_process_count",),
           "an indivisible split_batches batch is not reported for 2 processes"),
    Mutant("check-nvme-path-auto-accepted", "wizard/check/rules/deepspeed_json.py",
           (('if not path or path == "auto" or str(path).lower() == "none":\n            yield finding(',
             'if not path or str(path).lower() == "none":\n            yield finding('),),
           ("tests/unit/test_check_near_misses.py::test_an_nvme_path_that_names_no_directory_is_reported",),
           'nvme_path: "auto" (no directory) is not reported'),
    Mutant("check-gather-true-string-missing", "wizard/check/rules/deepspeed_json.py",
           (('return not any(v is True or str(v).lower() == "true" for v in values)',
             'return not any(v is True for v in values)'),),
           ("tests/unit/test_check_near_misses.py::test_the_16bit_gather_given_as_a_string_counts_as_given",),
           'the string "true" for the 16-bit gather on save is treated as missing'),
    Mutant("check-fix-overrides-gather-false", "wizard/check/rules/deepspeed_json.py",
           (("    if _gather_set_off(ctx):\n", "    if False:\n"),
            ("    if not _zero3_missing_gather(ctx) or _gather_set_off(ctx):\n",
             "    if not _zero3_missing_gather(ctx):\n")),
           ("tests/unit/test_check_near_misses.py::test_fix_never_turns_a_gather_you_set_false_into_true",),
           "--fix writes the 16-bit gather true over a false you set (issue 36)"),
    # ---- orphan cleanup (tests/functional/test_launch_trust.py, real processes, ~30 s each)
    Mutant("launch-reaper-disabled", "launch/_reaper.py",
           (("            pass\n    end(procs.values(), grace)\n", "            pass\n"),),
           (REAPER_TEST,),
           "the reaper never ends anything when the supervisor dies"),
    Mutant("launch-no-leftover-teardown", "launch/supervisor.py",
           (("                if leftovers and self.teardown_at is None:\n",
             "                if False:\n"),
            ("                if drained and not leftovers:\n", "                if drained:\n")),
           (LEFTOVER_TEST,),
           "processes left after the launcher exits are not ended"),
    Mutant("launch-kill-all-sends-nothing", "launch/processes.py",
           (("            self.signal_verified(p, signal.SIGKILL)\n", "            pass\n"),),
           (LEFTOVER_TEST,),
           "kill_all sends no SIGKILL"),
    # ---- the reaper and the run directory (tests/unit, real processes the tests started themselves: a
    # test that signals processes can only reach its own, so these mutants cannot hit the machine's)
    Mutant("launch-reaper-no-start-time-check", "launch/_reaper.py",
           (("            if abs(p.create_time() - ctime) > 0.05:\n                continue\n", ""),),
           ("tests/unit/test_launch_reaper.py::"
            "test_reap_skips_odd_gone_and_reused_entries_and_still_kills_the_tracked_process",),
           "the reaper ends a recorded pid that now belongs to another process (a recycled pid), and its children"),
    Mutant("launch-reaper-no-descendants", "launch/_reaper.py",
           (("            for c in p.children(recursive=True):\n                procs.setdefault(c.pid, c)\n", ""),),
           ("tests/unit/test_launch_reaper.py::"
            "test_reap_ends_the_descendants_of_a_tracked_process_it_was_never_told_about",),
           "the reaper ends only the processes it was told about, not their children in sessions of their own"),
    Mutant("launch-rundir-zombie-alive", "launch/rundir.py",
           (("        return proc.status() != psutil.STATUS_ZOMBIE\n", "        return True\n"),),
           ("tests/unit/test_launch_rundir.py::test_a_zombie_is_not_alive_even_with_its_own_start_time",),
           "a zombie (exited, not yet reaped) counts as a live process: a dead supervisor is never lost"),
    Mutant("launch-rundir-pid-0-valid", "launch/runschema.py",
           (('pid = integer(1, PID_MAX, f"a process id (1-{PID_MAX})")\n',
             'pid = integer(0, PID_MAX, f"a process id (1-{PID_MAX})")\n'),),
           ("tests/unit/test_launch_rundir.py::test_load_state_refuses_garbage_with_one_line",),
           "pid 0 is accepted in run.json (os.kill(0, sig) signals the caller's own process group)"),
    # ---- issue 37's trust boundaries: each mutant undoes one check
    Mutant("trust-socket-takes-any-peer", "launch/trust.py",
           (("    if uid != os.geteuid():\n        return pid, f\"it runs as uid {uid}",
             "    if False:\n        return pid, f\"it runs as uid {uid}"),
            ("    if launcher_pid is None or not descends_from(pid, launcher_pid):\n",
             "    if False:\n")),
           ("tests/unit/test_run_dir_trust.py::test_the_supervisor_socket_takes_only_descendants_of_the_launcher",
            "tests/unit/test_run_dir_trust.py::test_the_supervisor_socket_refuses_another_user"),
           "the supervisor's socket takes any local process for a rank (another user gets a pid killed)"),
    Mutant("trust-run-dir-of-anyone", "launch/trust.py",
           (("    if st.st_uid != os.geteuid():\n        return f\"{what} belongs to {_who(st.st_uid)}, not to you (",
             "    if False:\n        return f\"{what} belongs to {_who(st.st_uid)}, not to you ("),
            ("    if st.st_mode & 0o022:\n", "    if False:\n")),
           ("tests/unit/test_run_dir_trust.py::"
            "test_a_directory_writable_by_others_or_owned_by_another_user_is_not_acted_on",),
           "stop / attach / runs act on a run directory another user owns or may write (a forged run.json)"),
    Mutant("trust-any-process-of-the-user", "launch/trust.py",
           (("    ours = holds_open(pid, Path(run_dir) / lock_file) if supervisor else carries_run(proc, run_dir)\n",
             "    ours = True\n"),),
           ("tests/unit/test_launch_rundir.py::test_end_recorded_processes_signals_only_the_runs_own_processes",
            "tests/functional/test_view.py::test_send_control_signals_no_process_that_is_not_the_runs_supervisor"),
           "a pid and start time copied into run.json name a process `stop` ends: any process of the user's"),
    Mutant("trust-appends-follow-symlinks", "launch/trust.py",
           (("    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)\n",
             "    fd = os.open(path, flags | os.O_CLOEXEC | os.O_NONBLOCK, mode)\n"),),
           ("tests/unit/test_run_dir_trust.py::test_appends_never_go_through_a_symlink_or_a_hard_link",),
           "an append to events.jsonl goes through a symlink planted in the run directory (~/.bashrc)"),
    Mutant("preflight-proof-not-checked", "wizard/preflight/rendezvous.py",
           (("        if not verify(self.secret, hello.proof, \"node\", self.token, hello.nonce, hello.rank):\n",
             "        if False:\n"),),
           ("tests/unit/test_preflight_rendezvous.py::test_a_main_node_with_another_secret_refuses_the_node",
            "tests/unit/test_preflight_rendezvous.py::test_a_proof_is_good_for_one_connection_only"),
           "the main node takes whoever claims a rank for a node of the run (a stranger gets `all clear`)"),
    Mutant("launch-rundir-no-sigkill", "launch/rundir.py",
           (("    for p in alive:\n        try:\n            p.kill()\n        except psutil.Error:\n            pass\n",
             ""),),
           ("tests/unit/test_launch_rundir.py::"
            "test_end_recorded_processes_sigkills_what_ignores_sigterm_after_the_grace",),
           "end_recorded_processes sends SIGTERM only: a leftover that ignores it outlives `stop` of a lost run"),
    # ---- issue 21's launch points: each mutant undoes one fix
    Mutant("launch-reaper-records-nothing", "launch/_reaper.py",
           (("            record_lost(run_dir, sorted(procs), gone_at, time.monotonic() + RECORD_FOR_S)\n",
             "            pass\n"),),
           ("tests/unit/test_launch_reaper.py::"
            "test_the_reaper_records_lost_within_5_s_of_the_supervisors_sigkill_with_no_reader",),
           "a dead supervisor's run.json says running until someone runs attach or stop"),
    Mutant("launch-parent-death-is-sighup", "launch/supervisor.py",
           (("        set_parent_death_signal(parent_death_signal())\n",
             "        set_parent_death_signal(signal.SIGHUP)\n"),),
           ("tests/functional/test_launch_trust.py::"
            "test_killing_the_launch_the_user_started_ends_a_foreground_run[sighup-ignored-nohup]",),
           "under nohup the supervisor inherits an ignored SIGHUP and outlives a killed `wizard launch`"),
    Mutant("launch-stall-off-by-default", "launch/commands.py",
           (('    p.add_argument("--stall-timeout", type=float, default=DEFAULT_STALL_TIMEOUT_S, metavar="S",\n',
             '    p.add_argument("--stall-timeout", type=float, default=None, metavar="S",\n'),),
           ("tests/unit/test_launch_stall.py::test_a_default_launch_has_stall_detection_on_and_0_turns_it_off",),
           "a default launch has no stall detection: a hang waits forever"),
    Mutant("launch-traceback-after-a-bar-missed", "launch/logs.py",
           (("            text = after_progress_bar(text)\n", "            pass\n"),),
           ("tests/unit/test_launch_logs.py::test_a_traceback_glued_to_a_progress_bar_is_still_a_traceback",),
           "a rank's traceback that starts on its last tqdm bar's line is not seen: the crash is 'unknown'"),
    Mutant("slurm-mem-is-the-bare-plan-figure", "wizard/host_memory.py",
           (("max(1, math.ceil(plan_gib + margin + rss))", "max(1, math.ceil(plan_gib))"),),
           ("tests/functional/test_launch_cli.py::"
            "test_emit_slurm_asks_for_the_plans_host_ram_plus_the_processes_rss_and_says_how",),
           "--mem has no room for the processes' own RSS (a cgroup OOM kill)"),
    Mutant("slurm-wizard-cpu-config-asks-gpus", "launch/slurm.py",
           ((" and not wizard_wrote_for_cpu(plan) else None", " else None"),),
           ("tests/functional/test_launch_cli.py::"
            "test_emit_slurm_asks_no_gpu_for_a_config_the_wizard_wrote_for_cpu_processes",),
           "the wizard's DeepSpeed CPU config (use_cpu: false on purpose) asks SLURM for GPUs"),
    # ---- issue 41: the preflight at 64 machines (fail fast, no leftovers, the cause first, /dev/shm's free space)
    Mutant("preflight-collective-despite-a-finding", "wizard/preflight/meet.py",
           (("        if everyone and blocking is None and opts.collective:\n",
             "        if everyone and opts.collective:\n"),),
           ("tests/functional/test_preflight_scale.py::"
            "test_a_version_skew_on_one_agent_is_the_cause_everywhere_before_any_collective",),
           "the collectives run on a version skew: every node waits on them, and the symptom is named"),
    Mutant("preflight-children-outlive-a-kill", "wizard/preflight/children.py",
           (('        "ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)\\n"\n', ""),),
           ("tests/functional/test_preflight_signals.py::"
            "test_sigkill_during_the_collectives_ends_the_collective_and_the_ranks_it_spawned",
            "tests/functional/test_preflight_signals.py::"
            "test_a_signal_while_the_node_gathers_its_facts_ends_the_facts_child[KILL]"),
           "a killed preflight leaves its children running (no PR_SET_PDEATHSIG)"),
    Mutant("preflight-no-stop-on-a-failure", "wizard/preflight/meet.py",
           (("        if not stop:\n            stop.update(", "        if False:\n            stop.update("),),
           ("tests/functional/test_preflight_failfast.py::"
            "test_a_node_whose_collectives_fail_stops_every_nodes_within_seconds",),
           "the first node whose collectives fail stops nothing: the main node waits out the collective timeout"),
    Mutant("preflight-findings-by-node", "wizard/preflight/report.py",
           (("key=lambda r: (tier(r), r.node, index[id(r)]))", "key=lambda r: (r.node, index[id(r)]))"),),
           ("tests/unit/test_preflight_report.py::test_the_cause_comes_before_the_symptom_whatever_the_node_order",),
           "findings sorted by node: the verdict's first is node 0's symptom, not node 1's cause"),
    Mutant("preflight-shm-by-size", "wizard/preflight/limits.py",
           (("    free = total if free is None else free\n", "    free = total\n"),),
           ("tests/unit/test_preflight_limits.py::test_dev_shm_is_judged_by_its_free_space_and_whether_it_takes_a_file",),
           "a full /dev/shm passes on its size"),
    # ---- issue 22: the planner's figures and the layers (tests/unit/test_memory.py, test_speed.py, test_plan_lora.py,
    #      test_layers.py)
    Mutant("memory-gemma2-softcap-dropped", "wizard/sizing/memory.py",
           (("    softcap = w if p.softcap_scores else 0", "    softcap = 0"),),
           ("tests/unit/test_memory.py::test_gemma2_soft_capping_keeps_one_more_score_tensor",),
           "Gemma-2's soft-capped scores no longer counted in eager attention's saved bytes"),
    Mutant("memory-fsdp-root-tied-untied-swapped", "wizard/sizing/memory.py",
           (("    root = vocab_size * hidden_size * (1 if tied_embeddings else 2)",
             "    root = vocab_size * hidden_size * (2 if tied_embeddings else 1)"),),
           ("tests/unit/test_memory.py::test_fsdp_root_unit_holds_the_embedding_and_an_untied_head",),
           "FSDP's root unit counts a tied head twice and an untied one once"),
    Mutant("plan-speed-tie-doubled", "wizard/planning/reasons.py",
           (("SPEED_TIE = 0.03", "SPEED_TIE = 0.06"),),
           ("tests/unit/test_speed.py::test_a_speed_difference_of_four_percent_is_not_a_tie_and_two_percent_is",),
           "a rung 4-6 % faster is called a tie and loses to the earlier one"),
    Mutant("plan-nvme-class-as-cpu-offload", "wizard/planning/reasons.py",
           (("        return 2\n    return 1 if rung.offloads else 0", "        return 1\n    return 1 if rung.offloads else 0"),),
           ("tests/unit/test_speed.py::test_nvme_is_never_taken_while_a_host_ram_offload_rung_fits_even_when_faster",),
           "NVMe offload competes with CPU offload on speed instead of being the last resort"),
    Mutant("speed-zero3-hidden-share-halved", "wizard/planning/speed.py",
           (('OVERLAP = {"ddp": 0.8, "zero12": 0.8, "zero3": 0.6, "fsdp": 0.8}',
             'OVERLAP = {"ddp": 0.8, "zero12": 0.8, "zero3": 0.3, "fsdp": 0.8}'),),
           ("tests/unit/test_speed.py::test_zero3_hides_sixty_percent_of_its_gathers_behind_compute",),
           "ZeRO-3 hides 30 % of its gathers behind compute, not 60 %"),
    Mutant("speed-cpu-adam-every-core-per-process", "wizard/planning/speed.py",
           (("    cores_per_process = max(cores / max(per_machine, 1), 1.0)", "    cores_per_process = max(cores, 1.0)"),),
           ("tests/unit/test_speed.py::test_cpu_adam_gets_the_machines_cores_shared_by_its_processes",),
           "every process's CPU Adam counted with all of the machine's cores"),
    Mutant("lora-zero3-host-load-every-process", "wizard/planning/evaluate.py",
           (('        return "rank0"                  # zero.Init',
             '        return "every" if x.adapters is not None else "rank0"  # zero.Init'),),
           ("tests/unit/test_plan_lora.py::test_qlora_streams_the_base_to_the_gpus_instead_of_holding_it_in_host_ram",),
           "LoRA under ZeRO-3 counted as every process loading the base into host RAM (zero.Init loads it once)"),
    Mutant("layers-sizing-imports-the-pipeline", "wizard/sizing/memory.py",
           (("MARGIN_FRACTION = 0.07", "MARGIN_FRACTION = 0.07\n\n\ndef _planted():\n    from wizard.pipeline import build\n    return build"),),
           ("tests/unit/test_layers.py::test_no_import_runs_up_the_layers",),
           "an import inside a function runs up the layers (sizing -> pipeline)"),
)


def copy_checkout(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def apply(mutant: Mutant, root: Path) -> str | None:
    """Apply the edits in `root`; the reason when one cannot be (its text not found exactly once)."""
    path = root / mutant.path
    text = path.read_text()
    for old, new in mutant.edits:
        if text.count(old) != 1:
            return f"found {text.count(old)} times in {mutant.path}: {old.strip()[:60]!r}"
        text = text.replace(old, new)
    path.write_text(text)
    return None


def run(mutant: Mutant, timeout: float) -> tuple[str, list[str]]:
    """('killed' | 'SURVIVED' | 'stale', the tests that failed)."""
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as tmp:
        root = Path(tmp)
        copy_checkout(root)
        stale = apply(mutant, root)
        if stale:
            return "stale", [stale]
        env = dict(os.environ, PYTHONPATH=str(root))
        try:
            r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider",
                                *mutant.tests], cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "killed", ["(timed out)"]
        failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", r.stdout, re.M)
        if r.returncode in (4, 5):          # usage error / no tests collected: the node ids are wrong
            return "stale", [r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-300:]]
        return ("killed" if r.returncode != 0 else "SURVIVED"), failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per mutant's test run")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.names or m.name in args.names]
    unknown = set(args.names) - {m.name for m in MUTANTS}
    if unknown:
        parser.error(f"unknown mutants: {', '.join(sorted(unknown))}")
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.breaks}\n    " + "\n    ".join(m.tests))
        return 0
    bad = 0
    for m in chosen:
        verdict, failed = run(m, args.timeout)
        bad += verdict != "killed"
        print(f"{verdict:8} {m.name}: " + (", ".join(t.split("::")[-1] for t in failed) or "no test failed"),
              flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
