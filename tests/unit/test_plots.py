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


def test_wide_grids_are_drawn_smoothed_and_small_ones_cell_by_cell():
    """Issue 50.5: a 100 x 100 map drawn cell by cell in about 300 px showed moire (cells
    of 2 and 3 px side by side); wide grids are drawn as a smoothed image, small grids keep
    their crisp cells."""
    wide = plots.heatmap(np.arange(100 * 100.0).reshape(100, 100), 0, "wide")
    small = plots.heatmap(np.arange(20 * 20.0).reshape(20, 20), 0, "small")
    assert wide.data[0].zsmooth == "best"
    assert small.data[0].zsmooth is False
    # the values drawn are the grid's own (no resampling)
    assert np.array_equal(np.asarray(wide.data[0].z), np.arange(100 * 100.0).reshape(100, 100))
