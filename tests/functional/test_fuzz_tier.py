"""The fuzz tier: mutated inputs of every kind the wizard reads, each run as `wizard ...` would run, each held to
the promise of README's "Bad input": exit 0, 1, 2 or 3; on exit 2 one `wizard:` line; never a traceback; never
a file written by a command that failed; bounded memory and CPU time.

Seeded and bounded (tests/fuzz/cases.py makes the cases, tests/fuzz/forkserver.py runs them). The suite's run is
`FUZZ_CASES` cases of each kind; before a release, run many more with other seeds:

    WIZARD_FUZZ_SCALE=50 WIZARD_FUZZ_SEED=7 python -m pytest -q tests/functional/test_fuzz_tier.py

A failure prints the case (its kind, argv, what was mutated, and the files) so it can be run again by hand.
"""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import pytest

from tests.fuzz.cases import KINDS, Case
from tests.fuzz.forkserver import REPO, ForkServer

SEED = int(os.environ.get("WIZARD_FUZZ_SEED", "42"))
SCALE = float(os.environ.get("WIZARD_FUZZ_SCALE", "1"))
VERBOSE = bool(os.environ.get("WIZARD_FUZZ_VERBOSE"))      # each case's exit, CPU and wall time (with -s)
# cases per kind (flags: past its sweep of every float flag; model-sweep: values per key, at most 2)
FUZZ_CASES = {"ds-config": 16, "accelerate-yaml": 16, "training-args": 10, "model-config": 12, "model-sweep": 2,
              "flags": 40, "answers": 16, "prices": 12, "run-dir": 24}
CPU_LIMIT_S = 20           # the slowest clean case uses a few seconds of CPU; 200,000 keys took minutes
MEMORY_LIMIT = 2 << 30     # what a case may map beyond the server's own libraries
OK_CODES = {0, 1, 2, 3}
MAX_OUTPUT_LINES = 400     # a plan of every rung is about 150 lines; a finding per unknown key was 20,000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("fuzz-home")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO), "HOME": str(home),
           "HF_HOME": str(home / "hf"), "XDG_CACHE_HOME": str(home / "cache"), "WIZARD_NO_CACHE": "1",
           "WIZARD_CALIBRATION_FILE": str(home / "calibration.json"), "HF_HUB_OFFLINE": "1",
           "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "1", "TERM": "dumb", "COLUMNS": "120",
           "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(home / "ext"))}
    s = ForkServer(env, tmp_path_factory.mktemp("fuzz-io"))
    yield s
    s.close()


def _materialise(case: Case, where: Path) -> None:
    where.mkdir(parents=True)
    for name, text in case.files.items():
        (where / name).write_text(text, encoding="utf-8", errors="surrogatepass")
    for folder, files in case.dirs.items():
        (where / folder).mkdir(parents=True, mode=0o700)
        for name, text in files.items():
            (where / folder / name).write_text(text, encoding="utf-8", errors="surrogatepass")


def _tree(where: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(where)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(where.rglob("*"))}


def broken_promises(case: Case, outcome, before: dict, after: dict) -> list[str]:
    problems = []
    if outcome.signal is not None:
        name = signal.Signals(outcome.signal).name
        why = {"SIGXCPU": f"over {CPU_LIMIT_S} s of CPU", "SIGKILL": "no end within the wall limit"}.get(name, "")
        problems.append(f"ended by {name} {why}".strip())
    elif outcome.code not in OK_CODES:
        problems.append(f"exit {outcome.code}")
    text = outcome.stdout + outcome.stderr
    if "Traceback" in text:
        problems.append("a traceback")
    if "MemoryError" in text:
        problems.append("ran out of its memory cap")
    if len(outcome.stdout.splitlines()) > MAX_OUTPUT_LINES:
        problems.append(f"{len(outcome.stdout.splitlines())} lines of output (bounded input, bounded output)")
    if outcome.code == 2:
        errors = [line for line in outcome.stderr.splitlines()
                  if line.strip() and not line.startswith(("wizard: warning", "wizard: note", "Note:", "Warning:"))]
        if len(errors) != 1 or not errors[0].startswith(("wizard: ", f"wizard {case.argv[0]}: ")):
            problems.append(f"exit 2 with {len(errors)} error lines, not one `wizard:` line")
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    allowed = {k for k in changed if case.writes_to and k.split("/")[0] == case.writes_to and outcome.code == 0}
    if changed - allowed:
        problems.append(f"wrote {sorted(changed - allowed)[:5]} (exit {outcome.code})")
    return problems


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_mutated_input_keeps_the_promise(kind, server, tmp_path):
    rng = random.Random(f"{SEED}:{kind}")
    cases = KINDS[kind](rng, max(1, round(FUZZ_CASES[kind] * SCALE)))
    failures = []
    for i, case in enumerate(cases):
        where = tmp_path / f"case{i}"
        _materialise(case, where)
        before = _tree(where)
        outcome = server.run(case.argv, where, cpu_s=CPU_LIMIT_S, mem_bytes=MEMORY_LIMIT)
        problems = broken_promises(case, outcome, before, _tree(where))
        if VERBOSE:
            print(f"{kind} {i}: exit {outcome.code} cpu {outcome.cpu_s:.2f}s wall {outcome.wall_s:.2f}s {case.what[:70]!r}")
        if problems:
            tail = (outcome.stderr.strip().splitlines() or [""])[-1][:300]
            failures.append(f"case {i} ({case.what[:160]!r}): {', '.join(problems)}\n"
                            f"    wizard {' '.join(a[:60] for a in case.argv)}  [files in {where}]\n    {tail}")
    if failures:
        pytest.fail(f"{len(failures)} of {len(cases)} {kind} cases broke the promise:\n" + "\n".join(failures),
                    pytrace=False)
