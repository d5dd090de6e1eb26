"""The order in which pytest-xdist hands the test files to its workers: the longest first.

`--dist loadfile` gives each worker whole files. By default xdist queues them by their number of tests, so the
files of many quick unit tests went first and the few slow real-launch files last: a two-minute file started at
the end ran alone while the other worker idled. Longest first (the classic rule for two machines) leaves only
short files for the end. conftest.py sorts the collected files by `FILE_SECONDS` (xdist's own reordering is off:
`--no-loadscope-reorder` in pyproject's addopts); a file not listed counts as 0 s and keeps its place among those.

The figures are one suite run's junit times per file, summed (pytest --junitxml=J.xml, then
`python -m tests.file_order J.xml` prints the table to paste here). Only the order matters: stale figures cost
minutes of idle, never a result.
"""

from __future__ import annotations

import sys
from collections import Counter

# seconds per file, one run of the whole suite on this 2-core box (2026-12-07, 31.8 min, main at 8c5ac8f), files
# of 10 s or more
FILE_SECONDS = {
    "tests/unit/test_activation_measure.py": 377,
    "tests/functional/test_launch_supervisor.py": 248,
    "tests/functional/test_tune.py": 248,
    "tests/functional/test_tmux.py": 242,
    "tests/functional/test_gpu_bench_dry_run.py": 203,
    "tests/functional/test_cli.py": 178,
    "tests/functional/test_tui_pilot.py": 159,
    "tests/functional/test_checkpoint_resume.py": 119,
    "tests/functional/test_exit_codes.py": 111,
    "tests/functional/test_tui_typing.py": 108,
    "tests/functional/test_tui_snapshots.py": 103,
    "tests/functional/test_lora_training.py": 96,
    "tests/functional/test_launch_trust.py": 94,
    "tests/functional/test_launch_multinode.py": 90,
    "tests/functional/test_check_cli.py": 87,
    "tests/functional/test_launch_cli.py": 79,
    "tests/unit/test_check_golden.py": 67,
    "tests/functional/test_preflight_multinode.py": 66,
    "tests/functional/test_tune_probe.py": 62,
    "tests/functional/test_ulysses_launch.py": 60,
    "tests/functional/test_tui_recovery.py": 44,
    "tests/functional/test_compare_sky.py": 43,
    "tests/functional/test_compare.py": 39,
    "tests/functional/test_set_write.py": 37,
    "tests/functional/test_fuzz_tier.py": 36,
    "tests/functional/test_offload_cpu_adam.py": 36,
    "tests/functional/test_preflight_cli.py": 36,
    "tests/functional/test_tune_outcomes.py": 34,
    "tests/functional/test_tui_compare.py": 33,
    "tests/functional/test_preflight_fanout.py": 33,
    "tests/functional/test_tui_forms.py": 32,
    "tests/functional/test_prompts.py": 27,
    "tests/functional/test_tui_measure_screens.py": 27,
    "tests/unit/test_model.py": 26,
    "tests/functional/test_view.py": 26,
    "tests/functional/test_tui_plan_fit.py": 25,
    "tests/unit/test_lora_count.py": 23,
    "tests/functional/test_preflight_trust.py": 22,
    "tests/unit/test_gpu_bench.py": 22,
    "tests/functional/test_accelerate_differential.py": 19,
    "tests/functional/test_parallelism_launch.py": 18,
    "tests/functional/test_script_settings_faces.py": 16,
    "tests/unit/test_tune_probe_override.py": 15,
    "tests/functional/test_qlora_loading.py": 15,
    "tests/functional/test_check_library_engines.py": 14,
    "tests/functional/test_trust_boundaries.py": 14,
    "tests/functional/test_fsdp_8bit_optimizer.py": 13,
    "tests/unit/test_memory_published.py": 12,
    "tests/unit/test_checkpoint_plan.py": 11,
    "tests/functional/test_fuzz_findings.py": 10,
    "tests/functional/test_fuzz_cli.py": 10,
}


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def longest_files_first(nodeids: list[str]) -> list[str]:
    """`nodeids` reordered file by file, the longest files (FILE_SECONDS) first; a file's own tests, and files of
    equal weight, keep their order."""
    first_seen = {f: i for i, f in reversed(list(enumerate(file_of(n) for n in nodeids)))}
    return sorted(nodeids, key=lambda n: (-FILE_SECONDS.get(file_of(n), 0), first_seen[file_of(n)]))


def table_from_junit(path: str, at_least: float = 10.0) -> str:
    """FILE_SECONDS' text from a junit file: each file's summed test times, files of at least `at_least` s."""
    import xml.etree.ElementTree as ET

    seconds: Counter[str] = Counter()
    for case in ET.parse(path).iter("testcase"):
        seconds[case.get("classname", "").replace(".", "/") + ".py"] += float(case.get("time") or 0)
    rows = [f'    "{f}": {round(s)},' for f, s in seconds.most_common() if s >= at_least]
    return "FILE_SECONDS = {\n" + "\n".join(rows) + "\n}"


def cpu_table(path: str, top: int = 40) -> str:
    """Per file, from a WIZARD_TEST_CPU_LOG file (conftest.py): wall and CPU seconds, the costliest CPU first, and
    the totals (CPU / 2 is about the least wall time two workers can take)."""
    import json

    wall: Counter[str] = Counter()
    cpu: Counter[str] = Counter()
    for line in open(path):
        row = json.loads(line)
        wall[file_of(row["id"])] += row["wall"]
        cpu[file_of(row["id"])] += row["cpu"]
    rows = [f"{cpu[f]:8.1f} {wall[f]:8.1f}  {f}" for f, _ in cpu.most_common(top)]
    return "\n".join(["     cpu     wall  file"] + rows + [f"{sum(cpu.values()):8.1f} {sum(wall.values()):8.1f}  total"])


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--cpu":
        print(cpu_table(sys.argv[2]))
    elif len(sys.argv) == 2:
        print(table_from_junit(sys.argv[1]))
    else:
        sys.exit("usage: python -m tests.file_order JUNIT.xml | --cpu CPU_LOG")
