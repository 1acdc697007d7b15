"""The explorer's figures (reports.plots): what a reader compares must be comparable."""

import numpy as np
import pandas as pd

from reports import plots


def test_training_steps_are_on_a_log_axis_with_step_0_shown_and_one_hue_per_operator():
    """Issue 32.5: a linear step axis squeezed 10 of 14 checkpoints into its left edge, and
    + / * shared one colour as - / / did."""
    steps = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 2000, 3000]
    df = pd.DataFrame([{"step": s, "op": op, "effect": float(s + i)}
                       for s in steps for i, op in enumerate("+-*/")])
    fig = plots.evolution_lines(df, "effect", "t")
    axis = fig.layout.xaxis
    assert axis.type == "log"
    assert list(axis.ticktext) == [str(s) for s in steps]
    assert axis.tickvals[0] == 0.5 and list(axis.tickvals[1:]) == steps[1:]
    colours = {t.name: t.line.color for t in fig.data}
    assert colours == plots.OP_COLORS and len(set(colours.values())) == 4
    # each line's points sit at their steps (step 0 at its stand-in)
    plus = next(t for t in fig.data if t.name == "+")
    assert list(plus.x) == [0.5, *steps[1:]]


def test_grids_shown_side_by_side_share_one_colour_scale():
    a = np.array([[0.0, 1.0], [2.0, np.nan]])
    b = np.array([[-3.0, 0.5], [np.nan, np.nan]])
    assert plots.shared_range([a, b, None]) == (-3.0, 2.0)
    assert plots.shared_range([np.full((2, 2), np.nan)]) is None
    fig = plots.heatmap(a, 0, "step 64", zrange=(-3.0, 2.0))
    assert (fig.data[0].zmin, fig.data[0].zmax) == (-3.0, 2.0)
    assert fig.data[0].colorbar.title.text == "activation"
    own = plots.heatmap(a, 0, "alone")
    assert own.data[0].zmin is None and own.data[0].zmax is None
