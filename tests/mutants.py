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
    Mutant("memory-zero3-grad32-as-optimizer", "wizard/sizing/memory.py",
           (("gradients = layer_grads + int((sb.grad + FP32_GRAD_BYTES) * params / world)",
             "gradients = layer_grads + int(sb.grad * params / world)"),),
           ("tests/unit/test_memory.py::test_zero_breakdowns_put_each_byte_under_its_own_label",),
           "ZeRO-3's fp32 gradient partition counted as optimizer bytes (the sum stays right)"),
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
    Mutant("plan-fit-ignores-headroom", "wizard/planning/plan.py",
           (("    if est.per_gpu > x.usable:\n", "    if est.per_gpu > x.capacity:\n"),
            ("gc).per_gpu <= x.usable\n", "gc).per_gpu <= x.capacity\n")),
           ("tests/unit/test_plan.py::test_a_rung_fits_only_within_the_capacity_less_the_headroom",),
           "a rung fits when its estimate is within the whole GPU, headroom ignored"),
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
    Mutant("check-gpu-ids-off-by-one", "wizard/check/rules/accelerate_yaml.py",
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
    Mutant("check-fix-keeps-legacy-gather-keys", "wizard/check/rules/deepspeed_json.py",
           (('    for k in _GATHER_KEYS[1:]:\n        ctx.ds["zero_optimization"].pop(k, None)\n', ""),),
           ("tests/unit/test_check_near_misses.py::"
            "test_fix_replaces_a_legacy_gather_key_instead_of_adding_a_second_one",),
           "--fix adds the 16-bit gather key and leaves the legacy ones (saying false) beside it"),
    # ---- orphan cleanup (tests/functional/test_launch_trust.py, real processes, ~30 s each)
    Mutant("launch-reaper-disabled", "launch/_reaper.py",
           (("        reap(tracked)\n", "        pass\n"),),
           (REAPER_TEST,),
           "the reaper never ends anything when the supervisor dies"),
    Mutant("launch-no-leftover-teardown", "launch/supervisor.py",
           (("                if leftovers and self.teardown_at is None:\n",
             "                if False:\n"),
            ("                if drained and not leftovers:\n", "                if drained:\n")),
           (LEFTOVER_TEST,),
           "processes left after the launcher exits are not ended"),
    Mutant("launch-kill-all-sends-nothing", "launch/supervisor.py",
           (("            self.signal_verified(p, signal.SIGKILL)\n", "            pass\n"),),
           (LEFTOVER_TEST,),
           "kill_all sends no SIGKILL"),
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
