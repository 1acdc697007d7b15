"""The overview's checkpoint table (issue 50.4): two configs of one step told apart, every
operator in a row of its own (no column cut off at the page's right), the faithfulness
with its standard error and the prompts it stands on."""

import pandas as pd

from ui.views.overview import FEW_PROMPTS, checkpoint_table


def _checkpoints() -> pd.DataFrame:
    curve = {"+": [[1, 0.5], [4, 0.875], [16, 0.95]], "-": [[1, 0.2], [4, 0.6], [16, 0.9]]}
    share = [{"layer": "all", "family": "any", "op": "+", "share_top": 0.25,
              "share_random": 0.125},
             {"layer": 1, "family": "any", "op": "+", "share_top": 0.9, "share_random": 0.1}]
    return pd.DataFrame([
        # step 0 under two configs, step 100 under one, and a checkpoint with no summary
        {"checkpoint_id": 1, "step": 0, "config_id": 1, "duplicate_of_step": None,
         "weights": "aaaa", "accuracy": {"+": 0.0002, "-": 0.0004}, "faithfulness": curve,
         "enrichment": share},
        {"checkpoint_id": 1, "step": 0, "config_id": 2, "duplicate_of_step": None,
         "weights": "aaaa", "accuracy": {"+": 0.01, "-": 0.02}, "faithfulness": curve,
         "enrichment": []},
        {"checkpoint_id": 2, "step": 100, "config_id": 1, "duplicate_of_step": None,
         "weights": "bbbb", "accuracy": {"+": 0.99, "-": 0.98}, "faithfulness": curve,
         "enrichment": share},
        {"checkpoint_id": 3, "step": 200, "config_id": float("nan"), "duplicate_of_step": 100,
         "weights": "bbbb", "accuracy": None, "faithfulness": None, "enrichment": None},
    ])


def _points() -> pd.DataFrame:
    rows = []
    for ck, cfg, n in ((1, 1, 6), (1, 2, 12), (2, 1, 400)):
        for op, se in (("+", 0.125), ("-", 0.0625)):
            rows.append({"checkpoint_id": ck, "config_id": cfg, "op": op, "k": 4,
                         "ratio_of_means": 0.875, "ratio_of_means_se": se, "n": n})
            rows.append({"checkpoint_id": ck, "config_id": cfg, "op": op, "k": 16,
                         "ratio_of_means": 0.95, "ratio_of_means_se": 0.01, "n": n + 1})
    return pd.DataFrame(rows)


def test_a_row_per_checkpoint_config_and_operator_last_first():
    table, k = checkpoint_table(_checkpoints(), _points())
    assert k == 4  # the middle of the curve
    assert list(zip(table.step, table.config, table.op, strict=True)) == [
        (200, "", ""), (100, 1, "+"), (100, 1, "-"), (0, 1, "+"), (0, 1, "-"),
        (0, 2, "+"), (0, 2, "-")]
    # the columns stay few whatever the number of operators
    assert list(table.columns) == ["step", "config", "weights", "duplicate of", "op",
                                   "accuracy", "faithfulness", "n prompts",
                                   "labelled top / random"]
    assert table["duplicate of"].iloc[0] == "step 100"


def test_faithfulness_carries_its_error_and_its_prompts():
    table, _ = checkpoint_table(_checkpoints(), _points())
    row = table[(table.step == 100) & (table.op == "+")].iloc[0]
    assert row.faithfulness == "0.875 ± 0.125" and row["n prompts"] == 400
    # a model that answers almost nothing: the value is marked, and its n shown
    few = table[(table.step == 0) & (table.config == 1) & (table.op == "-")].iloc[0]
    assert few["n prompts"] == 6 < FEW_PROMPTS
    assert few.faithfulness == "0.600 ± 0.062 (few prompts)"
    other = table[(table.step == 0) & (table.config == 2) & (table.op == "+")].iloc[0]
    assert other["n prompts"] == 12 and other.accuracy == 0.01


def test_the_labelled_shares_are_the_whole_models():
    table, _ = checkpoint_table(_checkpoints(), _points())
    row = table[(table.step == 100) & (table.op == "+")].iloc[0]
    assert row["labelled top / random"] == "0.25 / 0.12"  # layer "all", not layer 1
    assert pd.isna(table[(table.step == 100) & (table.op == "-")].iloc[0][
        "labelled top / random"])


def test_a_stored_curve_without_its_points_shows_no_error_or_n():
    table, _ = checkpoint_table(_checkpoints(), _points().iloc[0:0])
    row = table[(table.step == 100) & (table.op == "+")].iloc[0]
    assert row.faithfulness == "0.875" and pd.isna(row["n prompts"])
