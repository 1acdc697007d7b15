"""Plotly figures of the explorer: grids as heatmaps, lens and evolution as lines."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go


def heatmap(grid: np.ndarray, lo: int, title: str, diverging: bool = False) -> go.Figure:
    """A (side, side) grid, op1 down the y axis and op2 along x; NaN cells stay blank."""
    side = grid.shape[0]
    axis = list(range(lo, lo + side))
    lim = float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 1.0
    fig = go.Figure(go.Heatmap(
        z=grid, x=axis, y=axis, colorscale="RdBu_r" if diverging else "Viridis",
        zmid=0 if diverging else None, zmin=-lim if diverging else None,
        zmax=lim if diverging else None, hoverongaps=False,
        hovertemplate="op1=%{y}<br>op2=%{x}<br>value=%{z:.3f}<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="op2", yaxis_title="op1", height=330,
                      margin=dict(l=40, r=10, t=40, b=40))
    fig.update_yaxes(autorange="reversed")
    return fig


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


def evolution_lines(df: pd.DataFrame, column: str, title: str) -> go.Figure:
    fig = px.line(df, x="step", y=column, color="op", markers=True, title=title)
    fig.update_layout(height=300, margin=dict(l=40, r=10, t=40, b=40))
    if df["step"].min() > 0:
        fig.update_xaxes(type="log")
    return fig


# one colour per heuristic family in every chart
FAMILY_COLORS = {"range": "#1f77b4", "modulo": "#ff7f0e", "pattern": "#2ca02c",
                 "value": "#d62728", "identical": "#9467bd", "multi_result": "#8c564b"}


def census_bars(df: pd.DataFrame) -> go.Figure:
    fig = px.bar(df, x="step", y="circuit_neurons", color="family", facet_col="op",
                 color_discrete_map=FAMILY_COLORS,
                 title="Circuit neurons implementing each heuristic family")
    fig.update_xaxes(type="category")
    fig.update_layout(height=360, margin=dict(l=40, r=10, t=60, b=40))
    return fig
