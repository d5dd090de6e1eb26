"""The library versions the wizard is tested with: one table, read by `wizard env`, the out-of-range note of
the CLI, README's "Supported versions" and `.ci/oldest-constraints.txt` (a unit test holds the last two to it).

Why a range and not a pin: users keep the torch / CUDA stack they have, so a version outside the range gets a
one-line note, never a refusal. The planner's arithmetic, the files written and `wizard check` lean on these
libraries' behaviour (DeepSpeed's estimators and config models, accelerate's launch checks, transformers'
"auto" filling, peft's adapter counts), and that behaviour is what the tests pin at both ends of the range.

Cheap on purpose: installed versions come from package metadata (`importlib.metadata`), which imports none of
the libraries, so the CLI can ask at any time without loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from typing import Callable

# Status of an installed version against its tested range.
IN_RANGE = "in range"
OLDER = "older"
NEWER = "newer"
MISSING = "missing"
UNREADABLE = "unreadable"      # metadata holds a version packaging cannot parse: said, never guessed at


@dataclass(frozen=True)
class VersionRange:
    name: str                  # the distribution name (pip's), as importlib.metadata knows it
    oldest: str
    newest: str
    noted: bool                # the written files, the plan or `wizard check` depend on it: out of range, a note
    optional: bool = False     # the wizard works without it (a missing one is no problem)
    where: str = ""            # where the ends of the range were run, for the reader of this table


# Oldest: the constraints CI installs (.ci/oldest-constraints.txt); newest: what the default CI install and the
# GPU measurement box ran. Raising an end means running the suite there first.
TESTED: tuple[VersionRange, ...] = (
    VersionRange("accelerate", "1.13.0", "1.16.0", noted=True, where="CI oldest .. CI newest"),
    VersionRange("deepspeed", "0.19.0", "0.19.8", noted=True, where="CI oldest .. CI newest"),
    VersionRange("transformers", "5.17.0", "5.25.0", noted=True, where="CI oldest (and the GPU box) .. CI newest"),
    VersionRange("peft", "0.21.0", "0.21.2", noted=True, where="CI oldest (and the GPU box) .. CI newest"),
    # CI runs the CPU build of 2.13.0 only; 2.11.0+cu130 ran on the GPU measurement box
    # (shared/gpu/2026-12-04/README.md), so the range claimed is 2.11 .. 2.13.
    VersionRange("torch", "2.11.0", "2.13.0", noted=True, where="GPU box (cu130) .. CI (CPU build)"),
    # Shown by `wizard env` beside the rest, without a note: they do not change what is planned or written.
    VersionRange("textual", "8.2.8", "8.2.8", noted=False, where="the test extra pins it (SVG snapshots)"),
    VersionRange("nvidia-ml-py", "13.610.43", "13.615.71", noted=False, where="GPU box .. CI"),
    VersionRange("bitsandbytes", "0.50.2", "0.50.2", noted=False, optional=True, where="CI (CPU backend)"),
)

# The libraries whose oldest versions CI installs through the constraints file; torch is left to the
# install command (a CPU build on CI, the user's own CUDA build elsewhere).
CONSTRAINED = ("accelerate", "deepspeed", "transformers", "peft")


def by_name(name: str) -> VersionRange:
    for entry in TESTED:
        if entry.name == name:
            return entry
    raise KeyError(name)


def release(text: str) -> tuple[int, ...] | None:
    """'2.13.0+cpu' -> (2, 13): the release numbers, trailing zeros dropped so 1.16 == 1.16.0.

    Local tags (+cpu, +cu130) and pre/post/dev parts are ignored: a CUDA build or a nightly of a tested
    release is that release. None when the text is no version at all.
    """
    from packaging.version import InvalidVersion, Version   # comes with accelerate, transformers, peft, deepspeed

    try:
        numbers = list(Version(text.strip()).release)
    except InvalidVersion:
        return None
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers.pop()
    return tuple(numbers)


def status(installed: str | None, entry: VersionRange) -> str:
    """Where an installed version stands against `entry`'s range: IN_RANGE, OLDER, NEWER, MISSING or UNREADABLE."""
    if installed is None:
        return MISSING
    have = release(installed)
    if have is None:
        return UNREADABLE
    if have < release(entry.oldest):
        return OLDER
    if have > release(entry.newest):
        return NEWER
    return IN_RANGE


def installed_version(name: str) -> str | None:
    """The installed version from package metadata (imports nothing), None when not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def range_text(oldest: str, newest: str) -> str:
    return oldest if oldest == newest else f"{oldest}–{newest}"


@dataclass(frozen=True)
class Installed:
    entry: VersionRange
    version: str | None
    status: str


def survey(lookup: Callable[[str], str | None] | None = None,
           entries: tuple[VersionRange, ...] = TESTED) -> list[Installed]:
    """Every tested library with its installed version and status (`lookup`: installed_version, looked up at
    call time so that a test may replace it)."""
    lookup = lookup or installed_version
    out = []
    for entry in entries:
        version = lookup(entry.name)
        out.append(Installed(entry, version, status(version, entry)))
    return out


def out_of_range_note(found: list[Installed]) -> str | None:
    """One line for the noted libraries outside their range, or None when all are in it.

    Missing ones are not named: the step that needs one says so itself, with what to install.
    """
    parts = []
    for item in found:
        if not item.entry.noted or item.status not in (OLDER, NEWER, UNREADABLE):
            continue
        if item.status == UNREADABLE:
            parts.append(f"{item.entry.name} reports the version {item.version!r}, which cannot be compared with "
                         f"the tested range {range_text(item.entry.oldest, item.entry.newest)}")
        else:
            parts.append(f"{item.entry.name} {item.version} is {item.status} than the tested range "
                         f"{range_text(item.entry.oldest, item.entry.newest)}")
    if not parts:
        return None
    return f"note: {'; '.join(parts)}; if something breaks, include `wizard env` in the report"


def oldest_constraints(entries: tuple[VersionRange, ...] = TESTED) -> list[str]:
    """The requirement lines `.ci/oldest-constraints.txt` must hold: each constrained library at its oldest."""
    return [f"{e.name}=={e.oldest}" for e in entries if e.name in CONSTRAINED]
