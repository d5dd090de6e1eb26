"""Golden files: `wizard --non-interactive` for each case of the matrix writes exactly the stored files,
and those files were accepted by accelerate, DeepSpeed and transformers (the CLI validates before writing),
with every check rule able to run on them."""

from __future__ import annotations

import pytest

from tests.golden import GOLDEN, run_case, stored
from tests.golden_cases import CASES


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_case(name, tmp_path):
    code, files, printed = run_case(name, tmp_path)
    assert code == 0, printed
    # Every write runs every check rule on what it writes: a rule that cannot run with the installed libraries
    # (a renamed private name of accelerate, say) is a failure here, not a warning a user reports.
    assert "CHECK-RULE-FAILED" not in printed and "could not run" not in printed, printed
    expected = stored(name)
    assert expected, f"no golden files for {name} in {GOLDEN}; run python tests/regen_golden.py {name}"
    assert files == expected, f"output differs from {GOLDEN / name}; if intended, run python tests/regen_golden.py {name}"


def test_matrix_is_big_enough():
    assert len(CASES) >= 12
