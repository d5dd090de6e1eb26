"""Regenerate snapshots/golden/ from the current code: python tests/regen_golden.py [CASE ...]

Review the diff (git diff snapshots/golden) before committing: a golden file is a promise to users.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.golden import run_case, store  # noqa: E402
from tests.golden_cases import CASES  # noqa: E402


def main(names: list[str]) -> int:
    failed = 0
    for name in names or list(CASES):
        with tempfile.TemporaryDirectory() as tmp:
            code, files, err = run_case(name, Path(tmp))
        if code != 0:
            print(f"{name}: exit {code}: {err.strip()}")
            failed += 1
            continue
        store(name, files)
        print(f"{name}: {', '.join(sorted(files))}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
