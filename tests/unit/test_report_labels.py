"""The report's labels section says which layers its pooled shares stand on, and sets
the top set's share beside the paper's with this run's own random set."""

from reports.labels import PAPER_SHARE, layer_span, markdown
from schema.report_reads import LabelData


def test_layer_span_names_the_layers_measured_and_how_many_of_the_model():
    assert layer_span(list(range(12, 24)), 24) == "layers 12-23 (12 of 24 measured)"
    assert layer_span([0, 1, 3, 7, 8], 9) == "layers 0-1, 3, 7-8 (5 of 9 measured)"
    assert layer_span([5], None) == "layer 5 (1 measured)"
    assert layer_span([], 4) == "no layers"


def _row(family, top, rnd, n=200):
    return {"layer": "all", "op": "+", "family": family, "labelled_top": top, "n_top": n,
            "labelled_random": rnd, "n_random": n, "labelled_layer": 10 * rnd,
            "n_layer": 10 * n, "difference": (top - rnd) / n, "ci_difference": (0.01, 0.2),
            "fisher_p": 1e-4}


def test_pooled_shares_say_their_layers_and_stand_beside_the_paper():
    d = LabelData(enrichment=[_row("any", 115, 91), _row("range", 100, 80)],
                  layers=[12, 13, 14], n_layers=24)
    md = "\n".join(markdown(d, ["+"], "values"))
    assert "Pooled over layers 12-14 (3 of 24 measured)" in md
    assert f"Beside the paper's {PAPER_SHARE:.0%}" in md
    # the 'any' row's own shares: 115/200 and 91/200
    assert "57.5% of the top set here against 45.5% of random neurons" in md
    # the table's header and rows stay together (the coverage line comes before them)
    lines = md.splitlines()
    head = lines.index(next(x for x in lines if x.startswith("| op | family |")))
    assert lines[head + 2].startswith("| + | any | 115/200 = 0.575")


def test_no_enrichment_no_comparison():
    md = "\n".join(markdown(LabelData(), ["+"], "values"))
    assert "Beside the paper" not in md and "No enrichment stored" in md
