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


def test_a_neurons_term_difference_is_printed_with_significant_digits():
    """Qwen2.5-Coder-0.5B's paired difference, +0.00035 +- 0.00024 logits per neuron (the
    stored summary of 2026-12-01), was printed 0.000 +- 0.000: an exact zero with no
    error, which it is not."""
    from reports.prompts import markdown as prompts_markdown

    med = {"median": 0.6, "ci": [0.5, 0.7]}
    e = {"n_prompts": 142, "mostly_labelled": {"count": 106, "n": 142, "ci": [0.67, 0.81]},
         "neuron_base_rate": 0.159, "n_neurons": 116736,
         "shares": {"labelled, heuristic holds": med, "heads": med},
         "n_for": {"50%": med, "80%": med}, "heuristics_in_80": med,
         "paired": {"difference": {"mean": 0.00035452, "se": 0.00024338},
                    "higher_when_holds": 10973, "n_neurons": 21597}}
    md = "\n".join(prompts_markdown({"+": e}, {}, ["+"]))
    assert "| 0.00035 ± 0.00024 (higher in 10973 of 21597 neurons) |" in md
    assert "0.000 ± 0.000" not in md
