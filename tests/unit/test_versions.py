"""The tested version range (wizard/versions.py): where a version stands against it, the one-line note, and the
places that repeat the range (the CI constraints file, README's table, pyproject's lower bounds) held to it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from wizard import versions
from wizard.versions import IN_RANGE, MISSING, NEWER, OLDER, UNREADABLE, VersionRange

ROOT = Path(__file__).resolve().parents[2]
ACC = VersionRange("accelerate", "1.13.0", "1.16.0", noted=True)


@pytest.mark.parametrize("installed, expected", [
    ("1.13.0", IN_RANGE), ("1.14.2", IN_RANGE), ("1.16.0", IN_RANGE), ("1.16", IN_RANGE),
    ("1.12.9", OLDER), ("0.34.2", OLDER), ("1.13.0rc1", IN_RANGE),   # release numbers only: rc1 of 1.13.0 is 1.13.0
    ("1.16.1", NEWER), ("1.17.0", NEWER), ("2.0.0", NEWER), ("1.17.0.dev0", NEWER),
    (None, MISSING), ("not a version", UNREADABLE),
])
def test_status_against_the_range(installed, expected):
    assert versions.status(installed, ACC) == expected


@pytest.mark.parametrize("installed, expected", [
    ("2.13.0+cpu", IN_RANGE), ("2.11.0+cu130", IN_RANGE), ("2.12.1+cu128", IN_RANGE),
    ("2.10.0+cu126", OLDER), ("2.14.0.dev20270101+cu130", NEWER), ("2.13.1+rocm6.4", NEWER),
])
def test_local_version_tags_are_ignored(installed, expected):
    assert versions.status(installed, versions.by_name("torch")) == expected


def test_release_drops_local_tags_and_trailing_zeros():
    assert versions.release("2.13.0+cpu") == versions.release("2.13") == (2, 13)
    assert versions.release("0.19.8") == (0, 19, 8)
    assert versions.release("garbage") is None


def fake(**installed):
    """A version lookup that knows only `installed` (dashes as underscores) and the newest of the rest."""
    def lookup(name):
        key = name.replace("-", "_")
        return installed[key] if key in installed else versions.by_name(name).newest
    return lookup


def test_no_note_when_everything_is_in_range():
    assert versions.out_of_range_note(versions.survey(fake())) is None


def test_the_note_is_one_line_naming_the_range():
    note = versions.out_of_range_note(versions.survey(fake(accelerate="1.17.0")))
    assert note == ("note: accelerate 1.17.0 is newer than the tested range 1.13.0–1.16.0; "
                    "if something breaks, include `wizard env` in the report")


def test_two_libraries_out_of_range_are_still_one_line():
    note = versions.out_of_range_note(versions.survey(fake(transformers="5.16.0", torch="2.14.0+cu130")))
    assert "\n" not in note and note.count("note:") == 1
    assert "transformers 5.16.0 is older than the tested range 5.17.0–5.25.0" in note
    assert "torch 2.14.0+cu130 is newer than the tested range 2.11.0–2.13.0" in note


def test_no_note_for_a_missing_library_or_one_that_does_not_shape_the_results():
    """A missing library is said by the step that needs it; textual does not change what is written."""
    found = versions.survey(fake(deepspeed=None, textual="9.0.0", bitsandbytes=None))
    assert versions.out_of_range_note(found) is None
    statuses = {i.entry.name: i.status for i in found}
    assert statuses["deepspeed"] == MISSING and statuses["textual"] == NEWER and statuses["bitsandbytes"] == MISSING


def test_an_unreadable_version_is_noted_not_guessed():
    note = versions.out_of_range_note(versions.survey(fake(peft="weird")))
    assert note is not None and "peft reports the version 'weird'" in note and "0.21.0–0.21.2" in note


def test_installed_version_reads_metadata_and_says_none_for_a_missing_package():
    assert versions.installed_version("packaging")
    assert versions.installed_version("no-such-distribution-wizard-test") is None


def test_every_range_is_ordered_and_readable():
    for entry in versions.TESTED:
        assert versions.release(entry.oldest) is not None and versions.release(entry.newest) is not None, entry
        assert versions.release(entry.oldest) <= versions.release(entry.newest), entry
    assert {"accelerate", "deepspeed", "transformers", "peft", "torch"} == {e.name for e in versions.TESTED if e.noted}


# ----------------------------------------------------------------------------- the copies of the range


def test_the_oldest_constraints_file_is_the_table():
    lines = [line.strip() for line in (ROOT / ".ci" / "oldest-constraints.txt").read_text().splitlines()]
    assert [line for line in lines if line and not line.startswith("#")] == versions.oldest_constraints()
    assert versions.oldest_constraints() == ["accelerate==1.13.0", "deepspeed==0.19.0", "transformers==5.17.0",
                                             "peft==0.21.0"]


def test_readme_supported_versions_is_the_table():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Supported versions", 1)[1].split("\n### ", 1)[0]
    rows = {m.group(1): (m.group(2), m.group(3))
            for m in re.finditer(r"^\| (\S+) \| ([0-9.]+)[^|]*\| ([0-9.]+)[^|]*\|$", section, re.M)}
    expected = {e.name: (e.oldest, e.newest) for e in versions.TESTED if e.noted}
    assert {name: tuple(versions.release(v) for v in pair) for name, pair in rows.items()} == \
           {name: tuple(versions.release(v) for v in pair) for name, pair in expected.items()}
    assert ".ci/oldest-constraints.txt" in section


def test_pyproject_lower_bounds_are_the_oldest_tested():
    text = (ROOT / "pyproject.toml").read_text()
    deps = text.split("dependencies = [", 1)[1].split("]", 1)[0]
    for entry in versions.TESTED:
        if not entry.noted:
            continue
        m = re.search(rf'"{re.escape(entry.name)}([^"]*)"', deps)
        assert m, f"{entry.name} is not a dependency"
        assert m.group(1).startswith(">=") and "<" not in m.group(1), m.group(1)   # a lower bound, no upper bound
        assert versions.release(m.group(1)[2:]) == versions.release(entry.oldest), (entry.name, m.group(1))
