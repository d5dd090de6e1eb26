"""Every shipped mutant still applies to the code (its text found exactly once), and names tests that exist:
a refactor that moves the code (plan.py's split did, for four of them) fails here, in the suite CI runs, instead of
leaving a 'stale' mutant that `python tests/mutants.py` alone would report."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.mutants import MUTANTS, REPO, apply


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_the_mutant_applies_to_the_code_as_it_is(mutant, tmp_path):
    copy = tmp_path / mutant.path
    copy.parent.mkdir(parents=True)
    shutil.copy2(REPO / mutant.path, copy)
    assert apply(mutant, tmp_path) is None
    assert copy.read_text() != (REPO / mutant.path).read_text()


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_the_mutants_tests_exist(mutant):
    for node in mutant.tests:
        path, _, name = node.partition("::")
        source = Path(REPO / path).read_text()
        assert f"def {name.split('[')[0]}(" in source, node
