"""Golden files: `wizard --non-interactive` for each case of the matrix writes exactly the stored files,
and those files were accepted by accelerate, DeepSpeed and transformers (the CLI validates before writing)."""

from __future__ import annotations

import pytest

from tests.golden import GOLDEN, run_case, stored
from tests.golden_cases import CASES


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_case(name, tmp_path):
    code, files, err = run_case(name, tmp_path)
    assert code == 0, err
    expected = stored(name)
    assert expected, f"no golden files for {name} in {GOLDEN}; run python tests/regen_golden.py {name}"
    assert files == expected, f"output differs from {GOLDEN / name}; if intended, run python tests/regen_golden.py {name}"


def test_matrix_is_big_enough():
    assert len(CASES) >= 12
