"""The catalog's tables, in one readable file (created only by Alembic migrations).

Entities: models, their checkpoints (weights hash, duplicate weights flagged),
measurement configs (hashed), heuristics, jobs. Measurements, one row per:
- ``neuron_op``: (checkpoint, config, layer, neuron, operator): activation statistics,
  patching effects, rank, best heuristic. Everything analysts filter on is a plain
  indexed column.
- ``neuron_grid``: the same key: the activation grid over the operator's valid cells,
  8-bit quantized with a per-grid scale and offset (see schema.quantize), stored in full
  for the top set and as a sketch for the rest, zstd-compressed (see schema.sketch).
- ``neuron_lens``: (checkpoint, config, layer, neuron): the logit lens.
- ``neuron_score``: (checkpoint, config, layer, neuron, operator, heuristic): raw scores,
  with their base rates, p-values and the label rule's verdict (``implements``).
The measurement tables are partitioned by HASH(model_id) into 8 partitions, so every
query about one model touches one partition and its indexes.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    REAL,
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    LargeBinary,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, DOUBLE_PRECISION, JSONB
from sqlmodel import Field, SQLModel

from schema.columns import _fk, _now, _ts
from schema.counterparts import NeuronCounterpart as NeuronCounterpart
from schema.explanation_columns import ExplanationColumns
from schema.fit_columns import FitColumns
from schema.job_tables import CatalogIdentity as CatalogIdentity
from schema.job_tables import ExplainRequestRow as ExplainRequestRow
from schema.job_tables import Job as Job
from schema.job_tables import JobLayer as JobLayer
from schema.job_tables import ReconcileEvent as ReconcileEvent
from schema.spectrum_columns import SpectrumColumns

N_PARTITIONS = 8
PARTITIONED = ("neuron_op", "neuron_grid", "neuron_lens", "neuron_score")


class Model(SQLModel, table=True):
    __tablename__ = "model"
    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(sa_column=Column(Text, nullable=False, unique=True))
    source: str = Field(sa_column=Column(String(16), nullable=False))
    n_layers: int
    d_model: int
    d_mlp: int
    d_vocab: int
    act_fn: str = Field(sa_column=Column(Text, nullable=False))
    gated_mlp: bool
    number_limit: int
    digit_level: bool
    created_at: datetime = Field(default_factory=_now, sa_column=_ts())


class Checkpoint(SQLModel, table=True):
    """One set of weights of a model; step is NULL for models without checkpoints."""

    __tablename__ = "checkpoint"
    # NULLS NOT DISTINCT: a model without steps (GGUF, a local directory) has one checkpoint
    __table_args__ = (UniqueConstraint("model_id", "step", name="uq_checkpoint_model_step",
                                       postgresql_nulls_not_distinct=True),)
    id: int | None = Field(default=None, primary_key=True)
    model_id: int = _fk("model", index=True)
    step: int | None = Field(default=None, sa_column=Column(BigInteger, nullable=True))
    revision: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    weights_hash: str = Field(sa_column=Column(String(64), nullable=False, index=True))
    # set when an earlier-stored checkpoint of the same model has identical weights
    duplicate_of_step: int | None = Field(default=None, sa_column=Column(BigInteger,
                                                                          nullable=True))
    created_at: datetime = Field(default_factory=_now, sa_column=_ts())
    # the load's largest next-token log-probability difference from transformers (nats);
    # NULL where nothing was compared (migration 0032)
    transformers_nats: float | None = Field(default=None, sa_column=Column(REAL, nullable=True))


class MeasureConfigRow(SQLModel, table=True):
    """A measurement config: its hash, full JSON and the columns analysts filter on."""

    __tablename__ = "measure_config"
    id: int | None = Field(default=None, primary_key=True)
    config_hash: str = Field(sa_column=Column(String(64), nullable=False, unique=True))
    config: dict = Field(sa_column=Column(JSONB, nullable=False))
    operators: str = Field(sa_column=Column(String(8), nullable=False))
    operand_lo: int
    operand_hi: int
    template: str = Field(sa_column=Column(Text, nullable=False))
    pairs_per_op: int
    seed: int
    heuristic_variant: str = Field(sa_column=Column(String(16), nullable=False))
    catalog_version: str = Field(sa_column=Column(String(32), nullable=False))
    created_at: datetime = Field(default_factory=_now, sa_column=_ts())


class GridLayout(SQLModel, table=True):
    """Which cells of the side x side operand grid are valid, per (config, token limit, op).

    ``valid`` is a packed bit mask (numpy.packbits, row-major a then b); the grids of
    ``neuron_grid`` hold the valid cells in that order. ``answer_index`` (int32 per valid
    cell) is the position of the cell's answer token on the logit lens's number axis, so
    the KV map is K times the lens at that index.
    """

    __tablename__ = "grid_layout"
    config_id: int = _fk("measure_config", primary_key=True)
    number_limit: int = Field(sa_column=Column(Integer, primary_key=True))
    op: str = Field(sa_column=Column(String(1), primary_key=True))
    lo: int
    side: int
    n_cells: int
    valid: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    answer_index: bytes = Field(sa_column=Column(LargeBinary, nullable=False))


class HeuristicRow(SQLModel, table=True):
    __tablename__ = "heuristic"
    id: int | None = Field(default=None, primary_key=True)
    key: str = Field(sa_column=Column(Text, nullable=False, unique=True))
    family: str = Field(sa_column=Column(String(32), nullable=False, index=True))
    target: str = Field(sa_column=Column(String(8), nullable=False))
    params: list = Field(sa_column=Column(JSONB, nullable=False))
    label: str = Field(sa_column=Column(Text, nullable=False))


class LayerResult(SQLModel, table=True):
    """A layer whose rows are stored: written in the same transaction as the rows."""

    __tablename__ = "layer_result"
    checkpoint_id: int = _fk("checkpoint", primary_key=True)
    config_id: int = _fk("measure_config", primary_key=True)
    layer: int = Field(sa_column=Column(SmallInteger, primary_key=True))
    n_neurons: int
    n_scores: int
    worker: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    seconds: float | None = Field(default=None, sa_column=Column(Float, nullable=True))
    # op -> {"n_pairs", "n_exact", "spearman"}: pairs used, neurons patched exactly, and the
    # rank agreement of attribution with exact patching on those neurons
    patching: dict | None = Field(default=None, sa_column=Column(JSONB))
    # op -> {"labelled", "n"}: the label rule on a sample of the layer's maps against
    # relabelled values (catalog.run.checkpoint.CheckpointRun._label_control; migration 0021)
    label_control: dict | None = Field(default=None, sa_column=Column(JSONB))
    written_at: datetime = Field(default_factory=_now, sa_column=_ts())


class CheckpointSummary(SQLModel, table=True):
    __tablename__ = "checkpoint_summary"
    checkpoint_id: int = _fk("checkpoint", primary_key=True)
    config_id: int = _fk("measure_config", primary_key=True)
    accuracy: dict = Field(sa_column=Column(JSONB, nullable=False))
    faithfulness: dict = Field(sa_column=Column(JSONB, nullable=False))
    heuristic_knockouts: list = Field(sa_column=Column(JSONB, nullable=False))
    prompt_knockouts: dict = Field(sa_column=Column(JSONB, nullable=False))
    n_heuristic_neurons: dict = Field(sa_column=Column(JSONB, nullable=False))
    # the layers the summary's circuits span; per operator the correct prompts, the
    # counterfactual pairs used and the correct prompts left out as solved examples
    layers: list[int] | None = Field(default=None, sa_column=Column(ARRAY(Integer)))
    n_correct: dict | None = Field(default=None, sa_column=Column(JSONB))
    n_pairs: dict | None = Field(default=None, sa_column=Column(JSONB))
    n_excluded: dict | None = Field(default=None, sa_column=Column(JSONB))
    # op -> per layer: the answer's median rank, top-1 share and mean log-probability in
    # the residual stream at the last position (migration 0019)
    residual_lens: dict | None = Field(default=None, sa_column=Column(JSONB))
    # labelled share of the top set against a random set of the layer, per layer, operator
    # and family, with intervals and Fisher's exact test (catalog.labels.enrichment; 0021)
    enrichment: list | None = Field(default=None, sa_column=Column(JSONB))
    # op -> heuristic key -> labels of heuristics with the same cells, scored once (0021)
    aliases: dict | None = Field(default=None, sa_column=Column(JSONB))
    # op -> each prompt's answer decomposed over the labelled neurons, aggregated over the
    # knockout's prompts (catalog.explain.grid.summarize_prompts; migration 0029)
    prompt_explanations: dict | None = Field(default=None, sa_column=Column(JSONB))
    written_at: datetime = Field(default_factory=_now, sa_column=_ts())


class PromptExplanation(ExplanationColumns, table=True):
    """One explained prompt (``ncat explain --store``; migration 0029)."""

    __tablename__ = "prompt_explanation"
    __table_args__ = (Index("prompt_explanation_model_idx", "model_id", "prompt"),)
    model_id: int = _fk("model")
    checkpoint_id: int = _fk("checkpoint", primary_key=True)
    config_id: int = _fk("measure_config", primary_key=True)
    prompt: str = Field(sa_column=Column(Text, primary_key=True))
    written_at: datetime = Field(default_factory=_now, sa_column=_ts())


class _CheckpointOpKey(SQLModel):
    """(model, checkpoint, config, operator): the key that checkpoint-level results of one
    operator share (component effects, circuit curves and their summaries)."""

    model_id: int = Field(foreign_key="model.id", ondelete="CASCADE", primary_key=True)
    checkpoint_id: int = Field(foreign_key="checkpoint.id", ondelete="CASCADE",
                               primary_key=True)
    config_id: int = Field(foreign_key="measure_config.id", ondelete="CASCADE",
                           primary_key=True)
    op: str = Field(sa_type=String(1), primary_key=True)


class ComponentEffect(_CheckpointOpKey, table=True):
    """The patching effect of one attention head (``head`` >= 0) or one whole MLP layer
    (``head`` = -1) at one prompt position (``position``: op1, op, op2, last), with the
    same statistics as a neuron's (migration 0019; docs/method.md section 6)."""

    __tablename__ = "component_effect"
    layer: int = Field(sa_type=SmallInteger, primary_key=True)
    head: int = Field(sa_type=SmallInteger, primary_key=True)
    position: str = Field(sa_type=String(8), primary_key=True)
    n_pairs: int = Field(sa_column=Column(Integer, nullable=False))
    effect_exact: float | None = Field(default=None, sa_column=Column(REAL))
    effect_exact_std: float | None = Field(default=None, sa_column=Column(REAL))
    effect_attr: float | None = Field(default=None, sa_column=Column(REAL))
    effect_attr_std: float | None = Field(default=None, sa_column=Column(REAL))
    effect_log: float | None = Field(default=None, sa_column=Column(REAL))
    effect_median: float | None = Field(default=None, sa_column=Column(REAL))
    effect_trimmed: float | None = Field(default=None, sa_column=Column(REAL))
    moved_share: float | None = Field(default=None, sa_column=Column(REAL))
    rank_value: float | None = Field(default=None, sa_column=Column(REAL))
    is_exact: bool = Field(sa_column=Column(Boolean, nullable=False))


class CircuitSummary(_CheckpointOpKey, table=True):
    """How one faithfulness protocol built one operator's circuits, its baselines and the
    areas of its curves (migration 0019)."""

    __tablename__ = "circuit_summary"
    protocol: str = Field(sa_type=String(16), primary_key=True)
    late_from: int | None = Field(default=None, sa_column=Column(SmallInteger))
    late_source: str | None = Field(default=None, sa_column=Column(String(8)))
    pruned: list[int] = Field(sa_column=Column(ARRAY(SmallInteger), nullable=False))
    whole: list[int] = Field(sa_column=Column(ARRAY(SmallInteger), nullable=False))
    heads: list = Field(sa_column=Column(JSONB, nullable=False))  # [[layer, head], ...] kept
    n_heads_kept: int = Field(sa_column=Column(Integer, nullable=False))
    n_prompts: int = Field(sa_column=Column(Integer, nullable=False))
    n_unique: int = Field(sa_column=Column(Integer, nullable=False))
    seeds: int = Field(sa_column=Column(SmallInteger, nullable=False))
    context: str = Field(sa_column=Column(String(8), nullable=False))
    population: str | None = Field(default=None, sa_column=Column(String(8)))
    ranking: str = Field(sa_column=Column(String(16), nullable=False))
    baselines: dict = Field(sa_column=Column(JSONB, nullable=False))
    areas: dict = Field(sa_column=Column(JSONB, nullable=False))


class CircuitPoint(_CheckpointOpKey, table=True):
    """One point of a faithfulness curve: a protocol's circuit (``ranked``, or the
    ``random`` and ``reversed`` controls) with ``k`` neurons per pruned layer, scored by
    one metric (migration 0019; catalog.circuits.faithfulness)."""

    __tablename__ = "circuit_point"
    protocol: str = Field(sa_type=String(16), primary_key=True)
    circuit: str = Field(sa_type=String(8), primary_key=True)
    metric: str = Field(sa_type=String(12), primary_key=True)
    k: int = Field(primary_key=True)
    fraction: float = Field(sa_column=Column(REAL, nullable=False))
    mib: bool = Field(sa_column=Column(Boolean, nullable=False))
    paper: bool = Field(sa_column=Column(Boolean, nullable=False))
    mean_ratio: float | None = Field(default=None, sa_column=Column(REAL))
    mean_ratio_se: float | None = Field(default=None, sa_column=Column(REAL))
    ratio_of_means: float | None = Field(default=None, sa_column=Column(REAL))
    ratio_of_means_se: float | None = Field(default=None, sa_column=Column(REAL))
    median_ratio: float | None = Field(default=None, sa_column=Column(REAL))
    n: int = Field(sa_column=Column(Integer, nullable=False))
    n_small: int = Field(sa_column=Column(Integer, nullable=False))
    # the ratio of means' conditioning (migration 0036; NULL in rows written before)
    n_clipped: int | None = Field(default=None, sa_column=Column(Integer))
    max_influence: float | None = Field(default=None, sa_column=Column(REAL))
    influence_bound: float | None = Field(default=None, sa_column=Column(REAL))


class FinalCircuitPoint(_CheckpointOpKey, table=True):
    """The final checkpoint's paper circuit (``ranked``) or its random control under the
    same plan (``random``), measured at this checkpoint (migration 0031;
    catalog.circuits.final)."""

    __tablename__ = "final_circuit_point"
    final_checkpoint_id: int = Field(foreign_key="checkpoint.id", ondelete="CASCADE",
                                     index=True)
    circuit: str = Field(sa_type=String(8), primary_key=True)
    metric: str = Field(sa_type=String(12), primary_key=True)
    k: int = Field(primary_key=True)
    fraction: float = Field(sa_column=Column(REAL, nullable=False))
    mib: bool = Field(sa_column=Column(Boolean, nullable=False))
    paper: bool = Field(sa_column=Column(Boolean, nullable=False))
    mean_ratio: float | None = Field(default=None, sa_column=Column(REAL))
    mean_ratio_se: float | None = Field(default=None, sa_column=Column(REAL))
    ratio_of_means: float | None = Field(default=None, sa_column=Column(REAL))
    ratio_of_means_se: float | None = Field(default=None, sa_column=Column(REAL))
    median_ratio: float | None = Field(default=None, sa_column=Column(REAL))
    n: int = Field(sa_column=Column(Integer, nullable=False))
    n_small: int = Field(sa_column=Column(Integer, nullable=False))
    # the ratio of means' conditioning (migration 0036; NULL in rows written before)
    n_clipped: int | None = Field(default=None, sa_column=Column(Integer))
    max_influence: float | None = Field(default=None, sa_column=Column(REAL))
    influence_bound: float | None = Field(default=None, sa_column=Column(REAL))


class _NeuronKey(SQLModel):
    """The key columns the four measurement tables share, first in each (its primary key
    starts with them; ``model_id`` is also the partition key)."""

    model_id: int = Field(primary_key=True)
    checkpoint_id: int = Field(primary_key=True)
    config_id: int = Field(primary_key=True)
    layer: int = Field(sa_type=SmallInteger, primary_key=True)
    neuron: int = Field(primary_key=True)


class _NeuronOpKey(_NeuronKey):
    op: str = Field(sa_type=String(1), primary_key=True)


class NeuronOp(_NeuronOpKey, SpectrumColumns, FitColumns, table=True):
    __tablename__ = "neuron_op"
    __table_args__ = (
        Index("ix_neuron_op_rank", "model_id", "checkpoint_id", "op", "rank"),
        Index("ix_neuron_op_neuron", "model_id", "layer", "neuron", "op"),
        # the explorer search's orders: the size of the effect (migration 0016), rank and
        # best score (0017; with its tie-breakers, 0018); by neuron is the primary key's order
        Index("ix_neuron_op_effect_size", "model_id", "checkpoint_id", "config_id",
              text("abs(rank_value) DESC NULLS LAST")),
        Index("ix_neuron_op_rank_order", "model_id", "checkpoint_id", "config_id", "rank"),
        Index("ix_neuron_op_score_order", "model_id", "checkpoint_id", "config_id",
              text("best_score DESC NULLS LAST"), "layer", "neuron", "op"),
        # the significant periods of each axis (migrations 0023, 0024)
        *(Index(f"ix_neuron_op_{x}_period", "model_id", "checkpoint_id",
                text(f"({x}_spec / 300)"),
                postgresql_where=text(f"(spec_helix & {1 << i}) <> 0"))
          for i, x in enumerate(("op1", "op2", "result", "kv"))),
        {"postgresql_partition_by": "HASH (model_id)"},
    )
    max_act: float = Field(sa_column=Column(REAL, nullable=False))
    mean_act: float = Field(sa_column=Column(REAL, nullable=False))
    # mean of the KV map (0034; NULL: a constant neuron, or written before)
    mean_kv: float | None = Field(default=None, sa_column=Column(REAL))
    density: float = Field(sa_column=Column(REAL, nullable=False))
    effect_exact: float | None = Field(default=None, sa_column=Column(REAL))
    effect_exact_std: float | None = Field(default=None, sa_column=Column(REAL))
    effect_attr: float | None = Field(default=None, sa_column=Column(REAL))
    effect_attr_std: float | None = Field(default=None, sa_column=Column(REAL))
    rank: int = Field(sa_column=Column(Integer, nullable=False))
    op_accuracy: float = Field(sa_column=Column(REAL, nullable=False))
    best_heuristic_id: int | None = Field(default=None, sa_column=Column(Integer))
    best_score: float | None = Field(default=None, sa_column=Column(REAL))
    # robust statistics of the log-space effect (docs/method.md section 5)
    effect_log: float | None = Field(default=None, sa_column=Column(REAL))
    effect_median: float | None = Field(default=None, sa_column=Column(REAL))
    effect_trimmed: float | None = Field(default=None, sa_column=Column(REAL))
    moved_share: float | None = Field(default=None, sa_column=Column(REAL))
    rank_value: float | None = Field(default=None, sa_column=Column(REAL))  # what rank orders
    is_exact: bool | None = Field(default=None, sa_column=Column(Boolean))
    constant: bool | None = Field(default=None, sa_column=Column(Boolean))  # no variance
    best_bottom: bool | None = Field(default=None, sa_column=Column(Boolean))
    labelled: bool | None = Field(default=None, sa_column=Column(Boolean))  # best is a label


class NeuronGrid(_NeuronOpKey, table=True):
    __tablename__ = "neuron_grid"
    __table_args__ = ({"postgresql_partition_by": "HASH (model_id)"},)
    q: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    scale: float = Field(sa_column=Column(REAL, nullable=False))
    vmin: float = Field(sa_column=Column(REAL, nullable=False))
    # schema.sketch: 0 raw bytes, 1 zstd; a sketch (block means, row and column means)
    # or the full grid (migration 0008)
    codec: int = Field(default=0, sa_column=Column(SmallInteger, nullable=False,
                                                   server_default="0"))
    sketch: bool = Field(default=False, sa_column=Column(Boolean, nullable=False,
                                                         server_default="false"))


class NeuronLens(_NeuronKey, table=True):
    __tablename__ = "neuron_lens"
    __table_args__ = ({"postgresql_partition_by": "HASH (model_id)"},)
    numbers: list[float] = Field(sa_column=Column(ARRAY(REAL), nullable=False))
    top_tokens: list[str] = Field(sa_column=Column(ARRAY(Text), nullable=False))
    top_values: list[float] = Field(sa_column=Column(ARRAY(REAL), nullable=False))
    bottom_tokens: list[str] = Field(sa_column=Column(ARRAY(Text), nullable=False))
    bottom_values: list[float] = Field(sa_column=Column(ARRAY(REAL), nullable=False))


class NeuronScore(_NeuronOpKey, table=True):
    __tablename__ = "neuron_score"
    __table_args__ = (
        # every reader names one checkpoint (migration 0012)
        Index("ix_neuron_score_checkpoint_heuristic", "model_id", "checkpoint_id", "heuristic_id",
              "score"),
        # the labels alone, one operator's range per heuristic (migration 0015)
        Index("ix_neuron_score_label", "model_id", "checkpoint_id", "heuristic_id", "op", "score",
              postgresql_where=text("implements")),
        {"postgresql_partition_by": "HASH (model_id)"},
    )
    heuristic_id: int = Field(primary_key=True)
    score: float = Field(sa_column=Column(REAL, nullable=False))
    bottom: bool = False
    # |S_H| / cells (the score noise gives) and the exact p-value of the score under a
    # random ordering of the map (docs/method.md section 7); NULL where not defined
    base_rate: float | None = Field(default=None, sa_column=Column(REAL))
    p_value: float | None = Field(default=None, sa_column=Column(DOUBLE_PRECISION))
    # the config's label rule: the neuron implements this heuristic on this operator
    implements: bool | None = Field(default=None, sa_column=Column(Boolean))
    # the grid can test the heuristic at the rule's level at all (0.10.0; 0026)
    testable: bool | None = Field(default=None, sa_column=Column(Boolean))


class CatalogSetting(SQLModel, table=True):
    """Analysis settings the views read (match threshold, circuit size); analysts may edit."""

    __tablename__ = "catalog_setting"
    key: str = Field(sa_column=Column(String(64), primary_key=True))
    value: float
