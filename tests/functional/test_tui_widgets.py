"""The plan's memory bars: proportions, the capacity mark, the overflow cut, the legend, and colours
that stay distinct in 256-colour terminals (what most SSH sessions get)."""

from __future__ import annotations

import itertools

import pytest

from rich.color import Color, ColorSystem

from wizard import pipeline
from wizard.frontends.tui.widgets.memory_bar import (
    CAPACITY_MARK,
    COLOURS,
    LETTERS,
    OVERFLOW,
    RungRow,
    bar,
    legend,
    plan_scale,
    short_name,
)
from wizard.frontends.tui.words import in_words
from wizard.planning.plan import COMPONENTS
from wizard.probe import hardware
from wizard.sizing import model
from wizard.units import GiB

pytestmark = pytest.mark.ui       # the screens: the oldest-libraries leg skips them (.ci/run)


def a_plan():
    hw = hardware.assume("8xA100-40GB")
    shape = model.from_params("7B")
    return pipeline.plan_from_answers(hw, shape, pipeline.resolve_pre_plan(hw, {"params": "7B"}))


def test_components_stack_in_order_and_in_proportion():
    plan = a_plan()
    rung = next(r for r in plan.rungs if r.fits)
    scale = plan_scale(plan)
    text = bar(rung, plan.gpu_capacity_bytes, scale, 60)
    assert len(text.plain) == 60
    colours = [str(span.style.bgcolor.triplet.hex) if span.style.bgcolor and span.style.bgcolor.triplet else None
               for span in text.spans]
    used = [c for c in colours if c is not None]
    order = [COLOURS[n] for n in COMPONENTS if rung.breakdown.get(n)]
    # Runs appear in COMPONENTS order (a component too small for a cell may be absent).
    assert [c for c in dict.fromkeys(used)] == [c for c in order if c in used]
    filled = sum(text.plain.count(letter) for letter in LETTERS.values())
    assert abs(filled - rung.per_gpu_bytes / scale * 60) <= len(order)
    # colour is not the only cue: each run is its component's letter, in COMPONENTS order
    letters = "".join(dict.fromkeys(c for c in text.plain if c in LETTERS.values()))
    assert letters == "".join(LETTERS[n] for n in COMPONENTS if LETTERS[n] in letters)


def test_capacity_mark_and_overflow_cut():
    plan = a_plan()
    ddp = next(r for r in plan.rungs if r.key == "ddp")
    assert ddp.per_gpu_bytes > 2 * plan.gpu_capacity_bytes           # 7B with AdamW on one 40 GB GPU: far over
    scale = plan_scale(plan)
    assert scale == 2 * plan.gpu_capacity_bytes                       # the bar is cut at twice the capacity
    text = bar(ddp, plan.gpu_capacity_bytes, scale, 40)
    assert text.plain.endswith(OVERFLOW)
    assert text.plain.index(CAPACITY_MARK) == 19                      # half way: capacity is half the scale
    fits = next(r for r in plan.rungs if r.fits)
    small = bar(fits, plan.gpu_capacity_bytes, scale, 40).plain
    assert CAPACITY_MARK in small and OVERFLOW not in small


def test_rows_say_why_and_mark_the_choice():
    plan = a_plan()
    rows = [RungRow(r, plan, chosen=r is plan.choice) for r in plan.rungs]
    chosen = [row for row in rows if row.chosen]
    assert len(chosen) == 1 and chosen[0].head(80).plain.startswith("▶ ")
    for row in rows:
        head = row.head(80).plain
        assert len(head) <= 80 and ("✓" in head) == row.rung.fits
        assert in_words(row.rung.reason) in row.why().plain
    assert short_name(plan.choice).startswith("ZeRO")


def test_legend_names_every_component_and_the_capacity():
    plan = a_plan()
    text = legend(plan).plain
    assert len(text) <= 78
    for component, name in (("parameters", "params"), ("gradients", "grads"), ("optimizer", "optim"),
                            ("activations", "activ"), ("logits", "logits"), ("buffers", "buf"),
                            ("context", "ctx"), ("margin", "margin")):
        assert f"{LETTERS[component]} {name}" in text
    assert len(set(LETTERS.values())) == len(COMPONENTS)
    assert "80.0 GiB" in text or f"{plan.gpu_capacity_bytes / GiB:.1f} GiB" in text


def test_component_colours_stay_distinct_in_256_colours():
    downgraded = {name: Color.parse(hex_).downgrade(ColorSystem.EIGHT_BIT).number for name, hex_ in COLOURS.items()}
    for a, b in itertools.combinations(COLOURS, 2):
        assert downgraded[a] != downgraded[b], (a, b)


def test_rung_names_are_whole_with_their_gc_mark_at_80_columns():
    """Issue 21: "ZeRO-3 +opt→CPU…" hid the "+GC" of a rung that checkpoints; the bar makes room instead."""
    hw = hardware.assume("8xA100-80GB,ram=2T")
    plan = pipeline.plan_from_answers(hw, model.from_params("70B"), pipeline.resolve_pre_plan(hw, {"params": "70B"}))
    long_names = [short_name(r) for r in plan.rungs if r.gradient_checkpointing and len(short_name(r)) > 16]
    assert "ZeRO-3 +opt→CPU +GC" in long_names
    column = max(len(short_name(r)) + 1 for r in plan.rungs)
    for width in (76, 116):             # the rung list's width at 80 and at 120 columns
        for rung in plan.rungs:
            head = RungRow(rung, plan, chosen=rung is plan.choice).head(width).plain
            assert len(head) <= width, head
            assert head[2:2 + column].rstrip() == short_name(rung), head     # whole, and one column for all
    narrow = RungRow(next(r for r in plan.rungs if short_name(r) == "ZeRO-3 +opt→CPU +GC"), plan,
                     chosen=False).head(50).plain
    assert "+GC" in narrow and "…" in narrow             # cut only when the bar has given up what it can
