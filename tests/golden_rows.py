"""A model-independent dump of what one catalog holds, for comparing two catalogs.

Ids (model, checkpoint, config, heuristic) differ between databases, so rows are keyed
by what they mean: (step, layer, neuron, op, heuristic key). Floats are kept as written
(REAL columns hold float32); grids as the stored bytes and their scale and offset.
"""

from __future__ import annotations

from schema import store
from schema.sketch import GridGeometry, full_codes

QUERIES = {
    "neuron_op": "SELECT c.step, n.layer, n.neuron, n.op, n.max_act, n.mean_act, n.density, "
                 "n.effect_exact, n.effect_exact_std, n.effect_attr, n.effect_attr_std, n.rank, "
                 "n.op_accuracy, n.best_score, bh.key FROM neuron_op n "
                 "JOIN checkpoint c ON c.id = n.checkpoint_id "
                 "LEFT JOIN heuristic bh ON bh.id = n.best_heuristic_id "
                 "ORDER BY 1, 2, 3, 4",
    "neuron_score": "SELECT c.step, s.layer, s.neuron, s.op, h.key, s.score, s.bottom "
                    "FROM neuron_score s JOIN heuristic h ON h.id = s.heuristic_id "
                    "JOIN checkpoint c ON c.id = s.checkpoint_id ORDER BY 1, 2, 3, 4, 5",
    # q decoded to the raw 8-bit codes in dump_rows (full grids only: sketch is checked)
    "neuron_grid": "SELECT c.step, g.layer, g.neuron, g.op, g.q, g.scale, "
                   "g.vmin, g.codec, g.sketch, l.side, l.valid FROM neuron_grid g "
                   "JOIN checkpoint c ON c.id = g.checkpoint_id "
                   "JOIN model m ON m.id = g.model_id "
                   "JOIN grid_layout l ON l.config_id = g.config_id AND l.op = g.op "
                   "AND l.number_limit = m.number_limit ORDER BY 1, 2, 3, 4",
    "neuron_lens": "SELECT c.step, l.layer, l.neuron, l.numbers, l.top_tokens, l.top_values, "
                   "l.bottom_tokens, l.bottom_values FROM neuron_lens l "
                   "JOIN checkpoint c ON c.id = l.checkpoint_id ORDER BY 1, 2, 3",
    "checkpoint_summary": "SELECT c.step, s.accuracy, s.faithfulness, s.heuristic_knockouts, "
                          "s.prompt_knockouts, s.n_heuristic_neurons FROM checkpoint_summary s "
                          "JOIN checkpoint c ON c.id = s.checkpoint_id ORDER BY 1",
}


# keys of a heuristic knockout row added after the golden rows were written; their own
# tests check them (tests/unit/test_circuits.py::test_knockout_verdicts_by_hand)
LATER = {"verdict"}


def dump_rows(url: str) -> dict[str, list[list]]:
    """Every measurement row of the catalog at ``url``, as JSON-ready lists."""
    out = {}
    with store.connect(url) as conn:
        for table, sql in QUERIES.items():
            rows = [list(r) for r in conn.execute(sql).fetchall()]
            if table == "neuron_grid":
                rows = [_grid_row(r) for r in rows]
            if table == "checkpoint_summary":  # fields added since the golden commit
                rows = [[*r[:3], [{k: v for k, v in row.items() if k not in LATER}
                                  for row in r[3]], *r[4:]] for r in rows]
                # since catalog 0.10.0 the summary's curve is the ratio of means; the
                # golden rows hold the paper's mean of ratios, kept in circuit_point
                for r in rows:
                    r[2] = _mean_ratio_curves(conn, r[0]) or r[2]
            out[table] = rows
    return out


def _mean_ratio_curves(conn, step: int) -> dict:
    """op -> [[k, the NL mean of ratios]] of the ranked circuits at ``step``."""
    out: dict = {}
    for op, k, f in conn.execute(
            "SELECT p.op, p.k, p.mean_ratio FROM circuit_point p "
            "JOIN checkpoint c ON c.id = p.checkpoint_id WHERE c.step = %s "
            "AND p.circuit = 'ranked' AND p.metric = 'nl' ORDER BY p.op, p.k", (step,)):
        out.setdefault(op, []).append([k, f])
    return out


def _grid_row(r: list) -> list:
    """(step, layer, neuron, op, hex of the 8-bit codes, scale, vmin) of a full grid."""
    *head, q, scale, vmin, codec, sketch, side, valid = r
    if sketch:
        raise AssertionError(f"grid {head} is a sketch; golden catalogs store full grids")
    codes = full_codes(q, codec, GridGeometry.from_packed(side, valid))
    return [*head, codes.tobytes().hex(), scale, vmin]
