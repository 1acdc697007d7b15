"""Plotly figures of the explorer: grids as heatmaps, lens and evolution as lines."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

# cells per side above which a heat map is drawn smoothed (about 5 px a cell at 330 px)
SMOOTH_ABOVE = 60


def heatmap(grid: np.ndarray, lo: int, title: str, diverging: bool = False,
            zrange: tuple[float, float] | None = None, unit: str = "activation") -> go.Figure:
    """A (side, side) grid, op1 down the y axis and op2 along x; NaN cells stay blank.
    ``zrange``: one colour scale shared by grids shown side by side (else the grid's own);
    ``unit`` titles the colour bar."""
    side = grid.shape[0]
    axis = list(range(lo, lo + side))
    lim = float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 1.0
    zmin, zmax = (-lim, lim) if diverging else (None, None)
    if zrange is not None:
        zmin, zmax = zrange
    # A grid wider than the pixels it is drawn in (100 cells in about 300 px) drawn cell by
    # cell gives cells of 2 and 3 pixels side by side, and the pattern shows as moire; drawn
    # as an image, smoothed, each cell keeps its share of the width.
    smooth = "best" if side > SMOOTH_ABOVE else False
    fig = go.Figure(go.Heatmap(
        z=grid, x=axis, y=axis, colorscale="RdBu_r" if diverging else "Viridis",
        zmid=0 if diverging else None, zmin=zmin, zmax=zmax, hoverongaps=False,
        zsmooth=smooth,
        colorbar=dict(title=dict(text=unit, side="right")),
        hovertemplate="op1=%{y}<br>op2=%{x}<br>value=%{z:.3f}<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="op2", yaxis_title="op1", height=330,
                      margin=dict(l=40, r=10, t=40, b=40))
    fig.update_yaxes(autorange="reversed")
    return fig


def shared_range(grids: list[np.ndarray]) -> tuple[float, float] | None:
    """(min, max) over the finite cells of grids compared side by side, or None."""
    finite = [g[np.isfinite(g)] for g in grids if g is not None and np.isfinite(g).any()]
    if not finite:
        return None
    values = np.concatenate(finite)
    return float(values.min()), float(values.max())


def profiles(row_means: np.ndarray, col_means: np.ndarray, lo: int, op: str) -> go.Figure:
    """A sketch's full-resolution means: over op2 for each op1 (rows), over op1 for each
    op2 (columns)."""
    axis = list(range(lo, lo + len(row_means)))
    fig = go.Figure([go.Scatter(x=axis, y=row_means, name="mean over op2, by op1"),
                     go.Scatter(x=axis, y=col_means, name="mean over op1, by op2")])
    fig.update_layout(title=f"Row and column means, {op}", xaxis_title="operand",
                      yaxis_title="mean activation", height=260,
                      margin=dict(l=40, r=10, t=40, b=40), legend=dict(orientation="h"))
    return fig


def lens_line(numbers: list[float]) -> go.Figure:
    fig = px.line(x=list(range(len(numbers))), y=numbers,
                  labels={"x": "number token", "y": "logit-lens value"})
    fig.update_layout(height=280, margin=dict(l=40, r=10, t=20, b=40))
    return fig


# one colour per operator in every chart (distinct hues: no two share a colour family)
OP_COLORS = {"+": "#1f77b4", "-": "#ff7f0e", "*": "#2ca02c", "/": "#9467bd"}


def evolution_lines(df: pd.DataFrame, column: str, title: str) -> go.Figure:
    """One line per operator over training steps, on a log step axis (checkpoints are
    spaced log-uniformly early in training); step 0 sits half a decade left of the first
    positive step, labelled 0."""
    steps = sorted(int(x) for x in df["step"].unique())
    positive = [x for x in steps if x > 0]
    zero_at = positive[0] / 2 if positive else 1.0
    plot = df.assign(step_axis=df["step"].where(df["step"] > 0, zero_at))
    fig = px.line(plot, x="step_axis", y=column, color="op", markers=True, title=title,
                  color_discrete_map=OP_COLORS, category_orders={"op": list(OP_COLORS)},
                  hover_data={"step": True, "step_axis": False})
    fig.update_layout(height=300, margin=dict(l=40, r=10, t=40, b=40))
    fig.update_xaxes(type="log", title="step (log scale)",
                     tickvals=[x if x > 0 else zero_at for x in steps],
                     ticktext=[str(x) for x in steps])
    return fig


AXIS_COLORS = {"op1": "#1f77b4", "op2": "#ff7f0e", "result": "#2ca02c", "kv": "#9467bd"}


def periodic_lines(df: pd.DataFrame, title: str) -> go.Figure:
    """The share of periodic maps per axis over training steps (``data.
    periodic_through_training`` of one config), on the same step axis as
    ``evolution_lines``."""
    fig = evolution_lines(df.rename(columns={"axis": "op"}), "share", title)
    for trace in fig.data:
        trace.line.color = AXIS_COLORS.get(trace.name, trace.line.color)
        trace.marker.color = trace.line.color
    fig.update_layout(legend_title_text="axis")
    fig.update_yaxes(title="share of live maps", rangemode="tozero")
    return fig


def family_colors() -> dict[str, str]:
    """One colour per heuristic family in every chart: each family's own
    (``catalog.labels.families``), so a family added there is coloured everywhere."""
    from catalog.labels.families import colors

    return colors()


def census_bars(df: pd.DataFrame) -> go.Figure:
    fig = px.bar(df, x="step", y="circuit_neurons", color="family", facet_col="op",
                 color_discrete_map=family_colors(),
                 title="Circuit neurons implementing each heuristic family")
    fig.update_xaxes(type="category")
    fig.update_layout(height=360, margin=dict(l=40, r=10, t=60, b=40))
    return fig
