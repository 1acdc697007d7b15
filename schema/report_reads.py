"""What the reports read (``ncat report``, the explorer's circuit pages): every SQL
statement of ``reports/``, and the plain containers they fill, beside the tables they
read. ``reports`` renders them (Markdown, HTML, figures); nothing here formats.

- ``gather_report``: a checkpoint's headline numbers (accuracy, effects by layer, labels
  of the top neurons, knockouts, the top neurons' maps) and the three below;
- ``gather_circuits``: its circuit tables (summaries, curve points, component effects,
  the residual lens);
- ``gather_labels``: the label enrichment, the controls and the untrained checkpoint's
  label rates;
- ``gather_periodic``: the periodic structure's distribution and its overlap with labels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from schema import reads, store
from schema.counterparts import report_counterparts
from schema.export_reads import locate
from schema.training import TrainingData, gather_training


@dataclass
class CircuitData:
    """What the report shows of one checkpoint's circuits."""

    summaries: list[dict] = field(default_factory=list)  # circuit_summary rows
    points: list[dict] = field(default_factory=list)  # circuit_point rows
    components: list[dict] = field(default_factory=list)  # component_effect rows
    residual_lens: dict = field(default_factory=dict)  # op -> per-layer lists
    n_layers: int = 0
    n_heads: int = 0

    def curve(self, op: str, protocol: str, circuit: str, metric: str) -> list[dict]:
        return sorted((p for p in self.points if p["op"] == op and p["protocol"] == protocol
                       and p["circuit"] == circuit and p["metric"] == metric),
                      key=lambda p: p["k"])

    def effects(self, op: str, position: str = "last") -> tuple[np.ndarray, np.ndarray]:
        """(MLP effect per layer, head effect (n_layers, n_heads)) at ``position``: the
        exact mean where it ran, else the attribution estimate (log-space)."""
        mlp = np.full(self.n_layers, np.nan)
        heads = np.full((self.n_layers, self.n_heads), np.nan)
        for r in self.components:
            if r["op"] != op or r["position"] != position:
                continue
            value = r["effect_log"]
            if r["head"] < 0:
                mlp[r["layer"]] = value
            else:
                heads[r["layer"], r["head"]] = value
        return mlp, heads


def gather_circuits(conn, model_id: int, checkpoint_id: int, config_id: int) -> CircuitData:
    """The circuit tables of one checkpoint under one config."""
    key = (model_id, checkpoint_id, config_id)
    where = "WHERE model_id = %s AND checkpoint_id = %s AND config_id = %s"

    def rows(sql: str) -> list[dict]:
        cur = conn.execute(sql, key)
        names = [c.name for c in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    order = {p: i for i, p in enumerate(("paper", "all-layers", "counterfactual"))}
    d = CircuitData(
        summaries=sorted(rows(f"SELECT * FROM circuit_summary {where}"),
                         key=lambda r: ("+-*/".index(r["op"]), order.get(r["protocol"], 9))),
        points=rows(f"SELECT * FROM circuit_point {where}"),
        components=rows(f"SELECT op, layer, head, position, effect_exact, effect_log, "
                        f"rank_value, is_exact FROM component_effect {where}"))
    lens = conn.execute("SELECT residual_lens FROM checkpoint_summary WHERE checkpoint_id = %s "
                        "AND config_id = %s", (checkpoint_id, config_id)).fetchone()
    d.residual_lens = (lens[0] if lens else None) or {}
    if d.components:
        d.n_layers = 1 + max(r["layer"] for r in d.components)
        d.n_heads = 1 + max(r["head"] for r in d.components)
    return d


@dataclass
class LabelData:
    enrichment: list[dict] = field(default_factory=list)
    # op -> (labelled, maps) of the relabelled-values control, summed over layers
    control: dict[str, tuple[int, int]] = field(default_factory=dict)
    # op -> (labelled, result-labelled, maps) of the token-format control (catalog 0.10.0)
    format_control: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    # op -> (labelled, neurons) at this checkpoint and at the untrained one (step 0)
    here: dict[str, tuple[int, int]] = field(default_factory=dict)
    untrained: dict[str, tuple[int, int]] = field(default_factory=dict)
    untrained_step: int | None = None
    top_set_fraction: float = 0.05
    # op -> heuristic key -> labels of the heuristics with the same cells, scored once
    aliases: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    # the layers measured at this checkpoint and config, of the model's n_layers
    layers: list[int] = field(default_factory=list)
    n_layers: int | None = None


def gather_labels(conn, model_id: int, checkpoint_id: int, config_id: int,
                  config: dict) -> LabelData:
    d = LabelData(top_set_fraction=float(config.get("top_set_fraction", 0.05)))
    row = conn.execute("SELECT enrichment, aliases FROM checkpoint_summary "
                       "WHERE checkpoint_id = %s AND config_id = %s",
                       (checkpoint_id, config_id)).fetchone()
    d.enrichment = (row[0] if row else None) or []
    d.aliases = (row[1] if row else None) or {}
    for (control,) in conn.execute(
            "SELECT label_control FROM layer_result WHERE checkpoint_id = %s AND config_id = %s "
            "AND label_control IS NOT NULL", (checkpoint_id, config_id)):
        for op, c in control.items():
            k, n = d.control.get(op, (0, 0))
            d.control[op] = (k + int(c["labelled"]), n + int(c["n"]))
            if "format_n" in c:
                fk, fr, fn = d.format_control.get(op, (0, 0, 0))
                d.format_control[op] = (fk + int(c["format_labelled"]),
                                        fr + int(c["format_result"]), fn + int(c["format_n"]))
    d.here = _label_rates(conn, model_id, checkpoint_id, config_id)
    d.layers = [int(r[0]) for r in conn.execute(
        "SELECT DISTINCT layer FROM layer_result WHERE checkpoint_id = %s AND config_id = %s "
        "ORDER BY layer", (checkpoint_id, config_id))]
    row = conn.execute("SELECT n_layers FROM model WHERE id = %s", (model_id,)).fetchone()
    d.n_layers = int(row[0]) if row and row[0] is not None else None
    first = conn.execute(
        "SELECT c.id, c.step FROM checkpoint c JOIN layer_result r ON r.checkpoint_id = c.id "
        "WHERE c.model_id = %s AND r.config_id = %s AND c.step = 0 AND c.id <> %s LIMIT 1",
        (model_id, config_id, checkpoint_id)).fetchone()
    if first is not None:
        d.untrained = _label_rates(conn, model_id, first[0], config_id)
        d.untrained_step = first[1]
    return d


def _label_rates(conn, model_id: int, checkpoint_id: int, config_id: int) -> dict:
    out = {}
    for op, k, n in conn.execute(
            "SELECT n.op, count(*) FILTER (WHERE EXISTS (SELECT 1 FROM neuron_score s WHERE "
            "s.model_id = n.model_id AND s.checkpoint_id = n.checkpoint_id AND "
            "s.config_id = n.config_id AND s.layer = n.layer AND s.neuron = n.neuron AND "
            "s.op = n.op AND s.implements)), count(*) FROM neuron_op n WHERE n.model_id = %s "
            "AND n.checkpoint_id = %s AND n.config_id = %s GROUP BY n.op",
            (model_id, checkpoint_id, config_id)):
        out[op] = (int(k), int(n))
    return out


AXES = ("op1", "op2", "result", "kv")


@dataclass
class PeriodicData:
    # (layer, axis) -> [periodic maps, live maps] over every operator
    counts: dict[tuple[int, str], list[int]] = field(default_factory=dict)
    # (layer, axis) -> {period: maps}
    periods: dict[tuple[int, str], dict[int, int]] = field(default_factory=dict)
    # rows of period_label_overlap: (op, family, target, n_labelled, n_agree, n_live, n_base)
    overlap: list[tuple] = field(default_factory=list)


def gather_periodic(conn, model_id: int, checkpoint_id: int, config_id: int) -> PeriodicData:
    d = PeriodicData()
    key = (model_id, checkpoint_id, config_id)
    per_op: dict[tuple[int, str], dict[str, tuple[int, int]]] = {}
    for layer, op, axis, period, n, n_periodic, n_live in conn.execute(
            "SELECT layer, op, axis, period, n, n_periodic, n_live FROM period_distribution "
            "WHERE model_id = %s AND checkpoint_id = %s AND config_id = %s", key):
        per_op.setdefault((layer, axis), {})[op] = (n_periodic, n_live)
        if period is not None:  # None: the row of an axis without periodic maps
            periods = d.periods.setdefault((layer, axis), {})
            periods[period] = periods.get(period, 0) + n
    d.counts = {k: [sum(v[0] for v in ops.values()), sum(v[1] for v in ops.values())]
                for k, ops in per_op.items()}
    d.overlap = [tuple(r) for r in conn.execute(
        "SELECT op, family, target, n_labelled, n_agree, n_live, n_base "
        "FROM period_label_overlap WHERE model_id = %s AND checkpoint_id = %s "
        "AND config_id = %s ORDER BY op, family, target", key)]
    return d


class ReportError(ValueError):
    """The catalog has nothing to report for what was asked."""


@dataclass
class ReportData:
    model: str
    step: int | None
    config_id: int
    config: dict
    layers: list[int]  # layers with stored rows
    top_n: int
    accuracy: dict[str, float] = field(default_factory=dict)
    n_prompts: dict[str, int] = field(default_factory=dict)
    n_pairs: dict[str, int] = field(default_factory=dict)
    summary_layers: list[int] | None = None
    layer_share: dict[str, dict[int, float]] = field(default_factory=dict)  # op -> layer -> share
    n_model_layers: int | None = None  # the model's layers (the shares cover d.layers)
    faithfulness: dict[str, list] = field(default_factory=dict)
    top_labelled: dict[str, tuple[int, int]] = field(default_factory=dict)  # op -> (k, n)
    all_labelled: dict[str, tuple[int, int]] = field(default_factory=dict)
    top_by_family: dict[str, dict[str, int]] = field(default_factory=dict)
    heuristic_knockouts: list = field(default_factory=list)
    prompt_knockouts: dict = field(default_factory=dict)
    prompt_explanations: dict = field(default_factory=dict)  # op -> the summary's aggregate
    spearman: dict[int, dict] = field(default_factory=dict)  # layer -> op -> facts
    top_neurons: list[tuple] = field(default_factory=list)  # (op, layer, neuron, value, label)
    grids: list[np.ndarray] = field(default_factory=list)  # their K maps
    sketch: list[bool] = field(default_factory=list)  # which of them are sketches
    circuits: CircuitData = field(default_factory=CircuitData)
    labels: LabelData = field(default_factory=LabelData)
    periodic: PeriodicData = field(
        default_factory=PeriodicData)
    training: TrainingData | None = None  # the model's checkpoints and seeds (migration 0031)
    # per checkpoint its neurons were matched in (schema.counterparts.report_counterparts)
    counterparts: list[dict] = field(default_factory=list)
    # the load's difference from transformers (nats; None: not compared; migration 0032)
    transformers_nats: float | None = None


def gather_report(url: str, model: str, step: int | None = None, top_n: int = 20,
           config_id: int | None = None, n_maps: int = 6) -> ReportData:
    """The report's numbers for ``model`` at ``step`` (default: its last measured one)."""
    with store.connect(url) as conn:
        at = locate(conn, model, step, config_id, error=ReportError)
        model_id, checkpoint_id, step, config_id, config = (
            at.model_id, at.checkpoint_id, at.step, at.config_id, at.config)
        n_model_layers = store.scalar(conn.execute("SELECT n_layers FROM model WHERE id = %s",
                                                   (model_id,)))
        key = (model_id, checkpoint_id, config_id)
        layers = [r[0] for r in conn.execute(
            "SELECT layer FROM layer_result WHERE checkpoint_id = %s AND config_id = %s "
            "ORDER BY layer", (checkpoint_id, config_id))]
        data = ReportData(model, step, config_id, config, layers, top_n)
        data.n_model_layers = n_model_layers
        data.transformers_nats = store.scalar(conn.execute(
            "SELECT transformers_nats FROM checkpoint WHERE id = %s", (checkpoint_id,)))
        for layer, patching in conn.execute(
                "SELECT layer, patching FROM layer_result WHERE checkpoint_id = %s "
                "AND config_id = %s AND patching IS NOT NULL ORDER BY layer",
                (checkpoint_id, config_id)):
            data.spearman[layer] = patching
        summ = conn.execute(
            "SELECT accuracy, faithfulness, heuristic_knockouts, prompt_knockouts, layers, "
            "n_pairs, prompt_explanations FROM checkpoint_summary WHERE checkpoint_id = %s "
            "AND config_id = %s",
            (checkpoint_id, config_id)).fetchone()
        if summ is not None:
            (data.accuracy, data.faithfulness, data.heuristic_knockouts,
             data.prompt_knockouts, data.summary_layers, pairs, explained) = summ
            data.n_pairs = pairs or {}
            data.prompt_explanations = explained or {}
        for op, n in conn.execute("SELECT op, n_cells FROM grid_layout WHERE config_id = %s "
                                  "AND number_limit = (SELECT number_limit FROM model "
                                  "WHERE id = %s)", (config_id, model_id)):
            data.n_prompts[op] = n
        for op, layer, total in conn.execute(
                "SELECT op, layer, sum(abs(rank_value)) FROM neuron_op WHERE model_id = %s "
                "AND checkpoint_id = %s AND config_id = %s GROUP BY op, layer", key):
            data.layer_share.setdefault(op, {})[layer] = float(total or 0.0)
        for op, shares in data.layer_share.items():
            grand = sum(shares.values())
            data.layer_share[op] = {k: (v / grand if grand else float("nan"))
                                    for k, v in sorted(shares.items())}
        labelled = ("EXISTS (SELECT 1 FROM neuron_score s WHERE s.model_id = n.model_id AND "
                    "s.checkpoint_id = n.checkpoint_id AND s.config_id = n.config_id AND "
                    "s.layer = n.layer AND s.neuron = n.neuron AND s.op = n.op AND "
                    "s.implements)")
        for op, top_k, top_n_, all_k, all_n in conn.execute(
                f"SELECT n.op, count(*) FILTER (WHERE n.rank < %s AND {labelled}), "
                f"count(*) FILTER (WHERE n.rank < %s), count(*) FILTER (WHERE {labelled}), "
                "count(*) FROM neuron_op n WHERE n.model_id = %s AND n.checkpoint_id = %s "
                "AND n.config_id = %s GROUP BY n.op", (top_n, top_n) + key):
            data.top_labelled[op] = (top_k, top_n_)
            data.all_labelled[op] = (all_k, all_n)
        for op, family, k in conn.execute(
                "SELECT n.op, h.family, count(DISTINCT (n.layer, n.neuron)) FROM neuron_op n "
                "JOIN neuron_score s ON s.model_id = n.model_id AND "
                "s.checkpoint_id = n.checkpoint_id AND s.config_id = n.config_id AND "
                "s.layer = n.layer AND s.neuron = n.neuron AND s.op = n.op "
                "JOIN heuristic h ON h.id = s.heuristic_id WHERE n.model_id = %s AND "
                "n.checkpoint_id = %s AND n.config_id = %s AND n.rank < %s AND s.implements "
                "GROUP BY n.op, h.family", key + (top_n,)):
            data.top_by_family.setdefault(op, {})[family] = k
        data.top_neurons = list(conn.execute(
            "SELECT n.op, n.layer, n.neuron, n.rank_value, CASE WHEN n.labelled THEN "
            "(CASE WHEN n.best_bottom THEN 'bottom-k ' ELSE '' END) || h.label END "
            "FROM neuron_op n LEFT JOIN heuristic h ON h.id = n.best_heuristic_id "
            "WHERE n.model_id = %s AND n.checkpoint_id = %s AND n.config_id = %s "
            "ORDER BY abs(n.rank_value) DESC NULLS LAST, n.layer, n.neuron, n.op LIMIT %s",
            key + (n_maps,)))
        stored = [reads.read_stored_grid(conn, model_id=model_id, checkpoint_id=checkpoint_id,
                                  config_id=config_id, layer=layer, neuron=neuron, op=op)
                  for op, layer, neuron, _, _ in data.top_neurons]
        data.circuits = gather_circuits(conn, *key)
        data.labels = gather_labels(conn, *key, config)
        data.periodic = gather_periodic(conn, *key)
        data.training = gather_training(conn, model=model, config_id=config_id)
        data.counterparts = report_counterparts(conn, checkpoint_id=checkpoint_id,
                                                config_id=config_id)
        data.grids = [g.values for g in stored]
        data.sketch = [g.sketch for g in stored]
    return data
