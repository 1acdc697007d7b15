"""What the explorer reads, as functions over a SQLAlchemy connection: every SQL
statement of its pages, beside the tables they read (the explorer, ``ui/data.py``, adds
its caching and its pooled engine; nothing here depends on Streamlit). Each returns a
pandas frame or plain values; every query is paged or bounded: no page loads a whole
table."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from sqlalchemy import text

# the search counts matching rows up to this many: an exact count of a wide model's
# checkpoint reads every row (786K at Pythia-1.4B's width), a top page reads fifty
COUNT_CAP = 10_000


def frame(conn, sql: str, **params) -> pd.DataFrame:
    """One statement's rows as a frame (``:name`` parameters)."""
    return pd.read_sql(text(sql), conn, params=params)


def ping(conn) -> None:
    """One round trip: raises if the database cannot be used."""
    conn.exec_driver_sql("SELECT 1")


def has_catalog(conn) -> bool:
    return bool(frame(conn, "SELECT EXISTS (SELECT 1 FROM neuron_op) AS x").x[0])


def grid_is_sketch(conn, model_id, checkpoint_id, config_id, layer, neuron, op) -> bool | None:
    """Whether the stored grid is a sketch (schema.sketch); None if there is none."""
    row = conn.execute(text(
        "SELECT sketch FROM neuron_grid WHERE model_id = :m AND checkpoint_id = :c AND "
        "config_id = :g AND layer = :l AND neuron = :n AND op = :o"),
        {"m": model_id, "c": checkpoint_id, "g": config_id, "l": layer, "n": neuron,
         "o": op}).fetchone()
    return None if row is None else bool(row[0])


def recent_config(conn) -> tuple[int, dict] | None:
    """(config id, stored config) of the most recent job, else of the newest stored config."""
    row = conn.execute(text("SELECT m.id, m.config FROM job j JOIN measure_config m ON "
                            "m.id = j.config_id ORDER BY j.id DESC LIMIT 1")).fetchone()
    if row is None:
        row = conn.execute(text("SELECT id, config FROM measure_config ORDER BY id DESC "
                                "LIMIT 1")).fetchone()
    return None if row is None else (int(row[0]), dict(row[1]))


def job_request(conn, model_id: int, checkpoint_id: int, config_id: int
                ) -> tuple[str, int | None, dict]:
    """(model name, step, stored config) of a catalogued checkpoint: what a job needs."""
    name, step = conn.execute(text("SELECT m.name, c.step FROM checkpoint c JOIN model m ON "
                                   "m.id = c.model_id WHERE c.id = :c AND m.id = :m"),
                              {"c": checkpoint_id, "m": model_id}).fetchone()
    config = conn.execute(text("SELECT config FROM measure_config WHERE id = :g"),
                          {"g": config_id}).scalar()
    return name, step, config


def link_names(conn, model_id: int, checkpoint_id: int, config_id: int
               ) -> tuple[str, int | None, str] | None:
    """What a stable link names (model name, step, the config's hash), for catalog ids;
    None when they name nothing."""
    row = conn.execute(text(
        "SELECT m.name, c.step, mc.config_hash FROM model m JOIN checkpoint c "
        "ON c.model_id = m.id CROSS JOIN measure_config mc WHERE m.id = :m AND c.id = :c "
        "AND mc.id = :g"), {"m": model_id, "c": checkpoint_id, "g": config_id}).fetchone()
    return None if row is None else (row[0], row[1], row[2])


def resolve_link(conn, model: str, step: int | None, config: str | None
                 ) -> tuple[int, int, int, int] | None:
    """(model id, checkpoint id, config id, configs at the checkpoint) a stable link names
    in this catalog: the model by name, the checkpoint by step (None: the final weights),
    the config by a prefix of its hash; a link without one (made before links named their
    config, when the model had one) takes the checkpoint's first catalogued config, the
    one such a link was made under. None when the catalog has none."""
    row = conn.execute(text(
        "SELECT m.id, c.id, lr.config_id, count(*) OVER () FROM model m "
        "JOIN checkpoint c ON c.model_id = m.id "
        "JOIN (SELECT checkpoint_id, config_id, min(written_at) AS first FROM layer_result "
        "      GROUP BY checkpoint_id, config_id) lr ON lr.checkpoint_id = c.id "
        "JOIN measure_config mc ON mc.id = lr.config_id "
        "WHERE m.name = :name AND c.step IS NOT DISTINCT FROM CAST(:step AS bigint) "
        "AND (CAST(:cfg AS text) IS NULL OR mc.config_hash LIKE CAST(:cfg AS text) || '%') "
        "ORDER BY lr.first, lr.config_id LIMIT 1"),
        {"name": model, "step": step, "cfg": config}).fetchone()
    return None if row is None else (int(row[0]), int(row[1]), int(row[2]), int(row[3]))


def search(conn, f: Filters, page: int, page_size: int = 50,
           cap: int = COUNT_CAP) -> tuple[pd.DataFrame, int]:
    """One page of neurons matching the filters, and how many match in all, counted up
    to `cap`: a total above `cap` means "more than cap"."""
    count, rows, params = search_sql(f, page, page_size, cap)
    found = frame(conn, rows, **params)
    return _with_base_rates(conn, f, found), int(frame(conn, count, **params).n[0])


def _with_base_rates(conn, f: Filters, rows: pd.DataFrame) -> pd.DataFrame:
    """The page's rows with their best heuristic's base rate (the share of maps noise
    alone scores as high) and p-value, read for the page's rows only: a broad set such as
    "op2 in [0, 50)" scores high often by chance, and ranks beside a specific one
    otherwise."""
    ids = rows.pop("best_heuristic_id")
    rows.insert(rows.columns.get_loc("best_score") + 1, "best_base_rate", float("nan"))
    rows.insert(rows.columns.get_loc("best_base_rate") + 1, "best_p_value", float("nan"))
    have = ids.notna()
    if not have.any():
        return rows
    rates = frame(
        conn,
        "SELECT u.i, s.base_rate, s.p_value FROM neuron_score s JOIN unnest("
        "CAST(:i AS int[]), CAST(:layer AS int[]), CAST(:neuron AS int[]), "
        "CAST(:op AS text[]), CAST(:h AS int[])) AS u(i, layer, neuron, op, h) "
        "ON s.layer = u.layer AND s.neuron = u.neuron AND s.op = u.op "
        "AND s.heuristic_id = u.h WHERE s.model_id = :model_id "
        "AND s.checkpoint_id = :checkpoint_id AND s.config_id = :config_id",
        i=[int(i) for i in rows.index[have]],
        layer=[int(x) for x in rows.layer[have]], neuron=[int(x) for x in rows.neuron[have]],
        op=[str(x) for x in rows.op[have]], h=[int(x) for x in ids[have]],
        model_id=f.model_id, checkpoint_id=f.checkpoint_id, config_id=f.config_id)
    for r in rates.itertuples():
        rows.loc[r.i, ["best_base_rate", "best_p_value"]] = [r.base_rate, r.p_value]
    return rows


@dataclass(frozen=True)
class Filters:
    model_id: int
    checkpoint_id: int
    config_id: int
    layer: int | None = None
    op: str | None = None
    family: str | None = None
    label: str = ""
    min_score: float = 0.0
    min_effect: float | None = None
    max_rank: int | None = None
    sort: str = "effect"
    periodic: str | None = None  # an axis of SPECTRUM_AXES, or "any": periodic there
    period: int | None = None  # with ``periodic``: that axis's dominant period


SPECTRUM_AXES = ("op1", "op2", "result", "kv")  # the bits of neuron_op.spec_helix, in order


SORTS = {"effect": "abs(n.rank_value) DESC NULLS LAST", "rank": "n.rank ASC",
         "score": "n.best_score DESC NULLS LAST", "neuron": "n.layer, n.neuron"}


def _where(f: Filters) -> tuple[str, dict]:
    cond = ["n.model_id = :model_id", "n.checkpoint_id = :checkpoint_id",
            "n.config_id = :config_id"]
    params: dict[str, object] = {"model_id": f.model_id, "checkpoint_id": f.checkpoint_id,
              "config_id": f.config_id}
    if f.layer is not None:
        cond.append("n.layer = :layer")
        params["layer"] = f.layer
    if f.op:
        cond.append("n.op = :op")
        params["op"] = f.op
    if f.min_effect is not None:
        cond.append("abs(n.rank_value) >= :min_effect")
        params["min_effect"] = f.min_effect
    if f.max_rank is not None:
        cond.append("n.rank <= :max_rank")
        params["max_rank"] = f.max_rank
    if f.periodic:
        # the packed spectrum (migration 0024): a bit per axis, the period in {axis}_spec
        axes = SPECTRUM_AXES if f.periodic == "any" else (f.periodic,)
        if f.periodic != "any" and f.periodic not in SPECTRUM_AXES:
            raise ValueError(f"periodic must be 'any' or one of {SPECTRUM_AXES}, "
                             f"not {f.periodic!r}")
        parts = []
        for x in axes:
            bit = 1 << SPECTRUM_AXES.index(x)
            parts.append(f"((n.spec_helix & {bit}) <> 0"
                         + (f" AND n.{x}_spec / 300 = :period)" if f.period else ")"))
        cond.append("(" + " OR ".join(parts) + ")")
        if f.period:
            params["period"] = f.period
    if f.family or f.label or f.min_score > 0:
        # constants (not correlations) so PostgreSQL prunes to one partition and hashes
        # the matching (layer, neuron, op) set once
        sub = ["s.model_id = :model_id", "s.checkpoint_id = :checkpoint_id",
               "s.config_id = :config_id", "s.score >= :min_score"]
        params["min_score"] = f.min_score
        if f.family:
            sub.append("h.family = :family")
            params["family"] = f.family
        if f.label:
            sub.append("h.label ILIKE :label")
            params["label"] = f"%{f.label}%"
        cond.append("(n.layer, n.neuron, n.op) IN (SELECT s.layer, s.neuron, s.op FROM "
                    "neuron_score s JOIN heuristic h ON h.id = s.heuristic_id "
                    f"WHERE {' AND '.join(sub)})")
        params["_score_filter"] = " AND ".join(sub)
    return " AND ".join(cond), params


def search_sql(f: Filters, page: int, page_size: int, cap: int) -> tuple[str, str, dict]:
    """(the capped count, the page, their parameters) of a search."""
    where, params = _where(f)
    score_filter = params.pop("_score_filter", None)
    count = f"SELECT count(*) AS n FROM (SELECT 1 FROM neuron_op n WHERE {where} LIMIT :cap) t"
    # with a heuristic filter, the heuristic that matched it (the best-scoring one), beside
    # the neuron's best heuristic overall
    matched, join = "", ""
    if score_filter:
        matched = "m.label AS matched_heuristic, m.score AS matched_score, "
        join = ("LEFT JOIN LATERAL (SELECT h.label, s.score FROM neuron_score s JOIN "
                f"heuristic h ON h.id = s.heuristic_id WHERE {score_filter} AND "
                "s.layer = n.layer AND s.neuron = n.neuron AND s.op = n.op "
                "ORDER BY s.score DESC LIMIT 1) m ON true ")
    rows = (
        f"SELECT n.layer, n.neuron, n.op, {matched}n.rank_value AS effect, n.is_exact, "
        "n.effect_exact, n.effect_attr, n.rank, h.label AS best_heuristic, n.best_score, "
        "n.best_bottom, n.labelled, n.max_act, n.best_heuristic_id "
        f"FROM neuron_op n LEFT JOIN heuristic h ON h.id = n.best_heuristic_id {join}"
        f"WHERE {where} "
        f"ORDER BY {SORTS[f.sort]}, n.layer, n.neuron, n.op LIMIT :lim OFFSET :off")
    return count, rows, {**params, "cap": cap + 1, "lim": page_size, "off": page * page_size}


def models(conn) -> pd.DataFrame:
    return frame(conn, "SELECT id, name, source, n_layers, d_mlp, number_limit, digit_level "
                 "FROM model ORDER BY name")


def checkpoints(conn, model_id: int) -> pd.DataFrame:
    """Checkpoints with stored results: step, weights hash, accuracy and faithfulness."""
    return frame(
        conn,
        "SELECT c.id AS checkpoint_id, c.step, s.config_id, c.duplicate_of_step, "
        "left(c.weights_hash, 12) AS weights, s.accuracy, s.faithfulness, s.enrichment, "
        "c.transformers_nats "
        "FROM checkpoint c LEFT JOIN checkpoint_summary s ON s.checkpoint_id = c.id "
        "WHERE c.model_id = :m ORDER BY c.step", m=model_id)


def headline_faithfulness(conn, model_id: int) -> pd.DataFrame:
    """Per checkpoint, config, operator and circuit size: the summary's headline
    faithfulness (the config's first protocol, the ranked circuit, the normalised logit's
    ratio of means) with its standard error and the number of prompts it stands on."""
    return frame(
        conn,
        "SELECT p.checkpoint_id, p.config_id, p.op, p.k, p.ratio_of_means, "
        "p.ratio_of_means_se, p.n FROM circuit_point p "
        "JOIN checkpoint c ON c.id = p.checkpoint_id "
        "JOIN measure_config mc ON mc.id = p.config_id "
        "WHERE c.model_id = :m AND p.circuit = 'ranked' AND p.metric = 'nl' "
        "AND p.protocol = mc.config -> 'faithfulness_protocols' ->> 0", m=model_id)


def config_hashes(conn, model_id: int) -> dict[int, str]:
    """config id -> its hash, for the configs the model was measured under."""
    rows = frame(conn, "SELECT DISTINCT mc.id, mc.config_hash FROM measure_config mc "
                 "JOIN layer_result lr ON lr.config_id = mc.id JOIN checkpoint c "
                 "ON c.id = lr.checkpoint_id WHERE c.model_id = :m", m=model_id)
    return dict(zip(rows.id.astype(int), rows.config_hash, strict=True))


def configs(conn, model_id: int) -> pd.DataFrame:
    return frame(
        conn,
        "SELECT DISTINCT mc.id, mc.operators, mc.operand_lo, mc.operand_hi, mc.pairs_per_op, "
        "mc.heuristic_variant, mc.template, mc.config ->> 'shots' AS shots, "
        "mc.config ->> 'label_rule' AS label_rule FROM measure_config mc JOIN layer_result lr "
        "ON lr.config_id = mc.id JOIN checkpoint c ON c.id = lr.checkpoint_id "
        "WHERE c.model_id = :m ORDER BY mc.id", m=model_id)


def families(conn) -> list[str]:
    return frame(conn, "SELECT DISTINCT family FROM heuristic ORDER BY family").family.tolist()


def layout(conn, config_id: int) -> pd.DataFrame:
    return frame(conn, "SELECT op, lo, side FROM grid_layout WHERE config_id = :c", c=config_id)


def neuron_ops(conn, model_id, checkpoint_id, config_id, layer, neuron) -> pd.DataFrame:
    return frame(
        conn,
        "SELECT n.op, n.rank_value AS effect, n.is_exact, n.effect_trimmed, n.effect_median, "
        "n.effect_log, n.moved_share, n.effect_exact, n.effect_attr, n.rank, n.max_act, "
        "n.mean_act, n.density, n.constant, h.label AS best_heuristic, n.best_score, "
        "n.best_bottom, n.labelled, n.kv_fit_operands, n.kv_fit_joint, n.kv_fit_other, "
        "n.kv_fit_other_op, n.kv_fit_joint - n.kv_fit_other AS kv_result_over_rival "
        "FROM neuron_op n "
        "LEFT JOIN heuristic h ON h.id = n.best_heuristic_id WHERE n.model_id = :m "
        "AND n.checkpoint_id = :c AND n.config_id = :g AND n.layer = :l AND n.neuron = :n "
        "ORDER BY n.op", m=model_id, c=checkpoint_id, g=config_id, l=layer, n=neuron)


def spectrum(conn, model_id, checkpoint_id, config_id, layer, neuron) -> pd.DataFrame:
    """The neuron's row of ``neuron_spectrum`` per operator (empty without spectra)."""
    axes = ("op1", "op2", "result", "kv")
    cols = ", ".join(f"s.{x}_{c}" for x in axes for c in ("period", "share", "periodic"))
    fits = ", ".join(f"s.{x}_{c}" for x in axes[:3] for c in ("fit", "linear"))
    return frame(
        conn,
        f"SELECT s.op, {cols}, {fits}, s.helix_r2 FROM neuron_spectrum s "
        "WHERE s.model_id = :m AND s.checkpoint_id = :c AND s.config_id = :g "
        "AND s.layer = :l AND s.neuron = :n ORDER BY s.op",
        m=model_id, c=checkpoint_id, g=config_id, l=layer, n=neuron)


def layer_patching(conn, checkpoint_id, config_id, layer) -> dict:
    """op -> {"n_pairs", "n_exact", "spearman"} of one stored layer ({} if not recorded)."""
    df = frame(conn, "SELECT patching FROM layer_result WHERE checkpoint_id = :c "
               "AND config_id = :g AND layer = :l", c=checkpoint_id, g=config_id, l=layer)
    return {} if df.empty or df.patching[0] is None else dict(df.patching[0])


def lens(conn, model_id, checkpoint_id, config_id, layer, neuron) -> dict | None:
    df = frame(conn, "SELECT numbers, top_tokens, top_values, bottom_tokens, bottom_values "
               "FROM neuron_lens WHERE model_id = :m AND checkpoint_id = :c AND config_id = :g "
               "AND layer = :l AND neuron = :n", m=model_id, c=checkpoint_id, g=config_id,
               l=layer, n=neuron)
    return None if df.empty else df.iloc[0].to_dict()


def matches(conn, model_id, checkpoint_id, config_id, layer, neuron, limit: int = 200):
    return frame(
        conn,
        "SELECT s.op, h.label, h.family, s.implements AS label_rule, s.score, s.base_rate, "
        "s.p_value, s.bottom FROM neuron_score s "
        "JOIN heuristic h ON h.id = s.heuristic_id WHERE s.model_id = :m "
        "AND s.checkpoint_id = :c AND s.config_id = :g AND s.layer = :l AND s.neuron = :n "
        "ORDER BY s.implements DESC NULLS LAST, s.score DESC, h.label LIMIT :lim",
        m=model_id, c=checkpoint_id, g=config_id, l=layer, n=neuron, lim=limit)


def evolution(conn, model_id, config_id, layer, neuron) -> pd.DataFrame:
    return frame(
        conn,
        "SELECT step, checkpoint_id, op, rank_value AS effect, effect_exact, rank, "
        "best_heuristic, best_score "
        "FROM neuron_evolution WHERE model_id = :m AND config_id = :g AND layer = :l "
        "AND neuron = :n ORDER BY step, op", m=model_id, g=config_id, l=layer, n=neuron)


def periodic_through_training(conn, model_id: int) -> pd.DataFrame:
    """Per config, step and axis, the share of live maps whose dominant period is
    significant (the packed bits of neuron_op.spec_helix); empty, after one probe of a
    partial index, for a model without periodic maps (most catalogs measure no spectra)."""
    probe = " OR ".join(f"EXISTS (SELECT 1 FROM neuron_op WHERE model_id = :m AND "
                        f"(spec_helix & {1 << i}) <> 0)" for i in range(len(SPECTRUM_AXES)))
    if not bool(frame(conn, f"SELECT {probe} AS any_periodic", m=model_id).any_periodic[0]):
        return pd.DataFrame(columns=["config_id", "step", "axis", "share", "n_periodic",
                                     "n_live"])
    sums = ", ".join(f"count(*) FILTER (WHERE (n.spec_helix & {1 << i}) <> 0) AS {x}"
                     for i, x in enumerate(SPECTRUM_AXES))
    wide = frame(
        conn,
        f"SELECT n.config_id, c.step, {sums}, count(*) AS n_live FROM neuron_op n "
        "JOIN checkpoint c ON c.id = n.checkpoint_id WHERE n.model_id = :m "
        "AND n.spec_helix IS NOT NULL AND NOT coalesce(n.constant, false) "
        "GROUP BY n.config_id, c.step ORDER BY n.config_id, c.step", m=model_id)
    long = wide.melt(id_vars=["config_id", "step", "n_live"], value_vars=list(SPECTRUM_AXES),
                     var_name="axis", value_name="n_periodic")
    return long.assign(share=long.n_periodic / long.n_live)[
        ["config_id", "step", "axis", "share", "n_periodic", "n_live"]]


def census(conn, model_id: int, config_id: int) -> pd.DataFrame:
    return frame(conn, "SELECT step, op, family, circuit_neurons FROM heuristic_census "
                 "WHERE model_id = :m AND config_id = :g ORDER BY step, op, family",
                 m=model_id, g=config_id)


def emergence(conn, model_id: int, config_id: int) -> pd.DataFrame:
    return frame(conn, "SELECT op, family, emergence_step, pairs FROM emergence_histogram "
                 "WHERE model_id = :m AND config_id = :g ORDER BY emergence_step, op, family",
                 m=model_id, g=config_id)


def overlap(conn, model_id: int, config_id: int) -> pd.DataFrame:
    return frame(conn, "SELECT step, final_pairs, present, share FROM checkpoint_overlap "
                 "WHERE model_id = :m AND config_id = :g ORDER BY step", m=model_id, g=config_id)
