"""The neuron page's first table (ui.views.neuron): one row per fact, one column per
operator, each fact explained, and why effects are missing where they are."""

import re

import pandas as pd

from schema import explorer_reads
from ui.views import neuron


def _selected_columns(monkeypatch) -> list[str]:
    seen = {}

    def capture(conn, sql, **params):
        seen["sql"] = sql
        return pd.DataFrame()

    monkeypatch.setattr(explorer_reads, "frame", capture)
    explorer_reads.neuron_ops(None, 1, 2, 3, 4, 5)
    select = seen["sql"].split(" FROM ")[0].removeprefix("SELECT ")
    return [re.split(r"\s+AS\s+|\.", c.strip())[-1] for c in select.split(",")]


def test_every_stored_fact_has_a_row_and_an_explanation(monkeypatch):
    columns = _selected_columns(monkeypatch)
    assert columns[0] == "op"
    assert sorted(c for c, _, _ in neuron.FACTS) == sorted(columns[1:])
    assert all(why for *_, why in neuron.FACTS)


def test_the_table_turns_operators_into_columns():
    cols = [c for c, _, _ in neuron.FACTS]
    row = {c: None for c in cols}
    plus = {**row, "op": "+", "effect": 0.0123456, "rank": 3, "is_exact": True,
            "constant": False, "best_heuristic": "op1 in [10, 20)"}
    minus = {**row, "op": "-", "is_exact": False}
    table = neuron.facts_table(pd.DataFrame([plus, minus]))
    assert list(table.columns) == ["fact", "+", "-", "what it means"]
    # operators in their usual order, whatever order the rows came in
    again = neuron.facts_table(pd.DataFrame([minus, plus]))
    assert list(again.columns) == list(table.columns)
    assert max(len(why) for *_, why in neuron.FACTS) <= 60  # fits its column
    assert len(table) == len(neuron.FACTS)
    by = table.set_index("fact")
    assert by.loc["effect (ranking statistic)", "+"] == "0.01235"
    assert by.loc["rank in the layer", "+"] == "3"
    assert by.loc["exact patching", "+"] == "yes" and by.loc["exact patching", "-"] == "no"
    assert by.loc["effect (ranking statistic)", "-"] == "—"
    assert by.loc["best heuristic", "+"] == "op1 in [10, 20)"


def test_missing_effects_are_explained_by_the_pairs():
    ops = pd.DataFrame({"op": ["+", "*"], "effect": [0.5, None]})
    note = neuron.no_effect_note(ops, {"+": {"n_pairs": 50}, "*": {"n_pairs": 0}})
    assert note.startswith("No patching effect for *:") and "0 pairs" in note
    assert "neuron index" in note
    assert neuron.no_effect_note(ops.iloc[:1], {"+": {"n_pairs": 50}}) is None
    other = neuron.no_effect_note(ops, {"*": {"n_pairs": 40}})
    assert "did not patch" in other


def test_the_spectrum_table_has_a_row_per_operator_and_measured_axis():
    """The neuron page's periodic structure (issue 34): one row per operator and axis with
    a period, in the usual operator order; the KV axis has no fits; the helix R^2 sits on
    the result row."""
    def row(op, periodic_op1, kv_period):
        r = {"op": op, "helix_r2": 0.4}
        for x in ("op1", "op2", "result", "kv"):
            r.update({f"{x}_period": 10, f"{x}_share": 0.5, f"{x}_periodic": False})
        for x in ("op1", "op2", "result"):
            r.update({f"{x}_fit": 0.6, f"{x}_linear": 0.1})
        r["op1_periodic"] = periodic_op1
        r["kv_period"] = kv_period
        return r
    spec = pd.DataFrame([row("*", False, None), row("+", True, 5)])
    table = neuron.spectrum_table(spec)
    assert list(table.operator) == ["+"] * 4 + ["*"] * 3
    assert list(table.axis[:4]) == ["op1", "op2", "result", "result, KV map"]
    plus = table[table.operator == "+"].set_index("axis")
    assert plus.loc["op1", "periodic"] and not plus.loc["op2", "periodic"]
    assert plus.loc["result, KV map", "period"] == 5
    assert pd.isna(plus.loc["result, KV map", "fit R^2"])
    assert plus.loc["result", "helix R^2"] == 0.4 and pd.isna(plus.loc["op1", "helix R^2"])
    assert neuron.spectrum_table(spec.iloc[:0]).empty
