"""What a checkpoint run returns: per layer, per checkpoint, and what the summary keeps.

``LayerResult`` holds every measurement of one layer (activations included);
``LayerDigest`` is the part of it the checkpoint summary needs, kept when the layer's
arrays are dropped or read back from the store; ``Summary`` is the checkpoint level.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np
from jaxtyping import Float

from catalog.circuits import paper
from catalog.config import ScienceConfig
from catalog.core.maps import kv_map
from catalog.core.tokens import NumberTokens
from catalog.labels.matches import Matches
from catalog.measuring import effects
from catalog.measuring.components import ComponentEffects
from catalog.measuring.lens import LensResult
from catalog.measuring.prompts import PromptTable
from catalog.periodic.spectra import LayerSpectra


@dataclass
class LayerDigest:
    """What the checkpoint summary needs of one layer."""

    effect: np.ndarray  # (d_mlp, op) rank key, largest first (NaN: not measured)
    matches: Matches
    attribution: np.ndarray | None  # (d_mlp, op) the paper's ranking; None without it
    # (d_mlp, op) the K and KV maps' means, against which a label's side is checked on a
    # prompt (catalog.explain.holds); None: not known (side not checked)
    mean_act: np.ndarray | None = None
    mean_kv: np.ndarray | None = None


@dataclass
class LayerStats:
    """A layer's (d_mlp, op) statistics while ``run_layer`` fills them, one operator's
    column at a time (NaN where not measured); ``LayerResult`` keeps them by the same
    names."""

    max_act: np.ndarray
    mean_act: np.ndarray
    mean_kv: np.ndarray
    density: np.ndarray
    effect_exact: np.ndarray
    effect_exact_std: np.ndarray
    effect_attr: np.ndarray
    effect_attr_std: np.ndarray
    effect_log: np.ndarray
    effect_median: np.ndarray
    effect_trimmed: np.ndarray
    moved_share: np.ndarray
    rank_value: np.ndarray
    is_exact: np.ndarray  # bool
    constant: np.ndarray  # bool

    @classmethod
    def empty(cls, d_mlp: int, n_ops: int) -> LayerStats:
        arrays = {f.name: np.full((d_mlp, n_ops), np.nan, dtype=np.float32)
                  for f in fields(cls) if f.name not in ("is_exact", "constant")}
        return cls(**arrays, is_exact=np.zeros((d_mlp, n_ops), dtype=bool),
                   constant=np.zeros((d_mlp, n_ops), dtype=bool))

    def set_effects(self, rows, o: int, pairs: effects.PairStats, rank_value: np.ndarray,
                    exact: bool) -> None:
        """Column ``o`` of ``rows`` from one patching method's per-pair statistics."""
        if exact:
            self.effect_exact[rows, o], self.effect_exact_std[rows, o] = pairs.mean, pairs.std
            self.is_exact[rows, o] = True
        else:
            self.effect_attr[rows, o], self.effect_attr_std[rows, o] = pairs.mean, pairs.std
        self.effect_log[rows, o], self.effect_median[rows, o] = pairs.log_mean, pairs.median
        self.effect_trimmed[rows, o], self.moved_share[rows, o] = pairs.trimmed, pairs.moved
        self.rank_value[rows, o] = rank_value


@dataclass
class LayerResult:
    """All measurements of one layer. Arrays over operators use config.operators order."""

    layer: int
    acts: Float[np.ndarray, "prompt d_mlp"]  # K maps, prompts in table order
    lens: LensResult
    answer_lens: Float[np.ndarray, "d_mlp prompt"]  # lens value of each prompt's answer token
    max_act: Float[np.ndarray, "d_mlp op"]
    mean_act: Float[np.ndarray, "d_mlp op"]
    # mean of the KV map (NaN for constant neurons, which have none): result labels' sides
    mean_kv: Float[np.ndarray, "d_mlp op"]
    density: Float[np.ndarray, "d_mlp op"]  # share of the operator's prompts with act > 0
    effect_exact: Float[np.ndarray, "d_mlp op"] | None  # the paper's mean; NaN if not exact
    effect_exact_std: Float[np.ndarray, "d_mlp op"] | None
    effect_attr: Float[np.ndarray, "d_mlp op"] | None
    effect_attr_std: Float[np.ndarray, "d_mlp op"] | None
    # robust statistics of the log-space effect (catalog.measuring.effects), exact where measured
    effect_log: Float[np.ndarray, "d_mlp op"]
    effect_median: Float[np.ndarray, "d_mlp op"]
    effect_trimmed: Float[np.ndarray, "d_mlp op"]
    moved_share: Float[np.ndarray, "d_mlp op"]
    is_exact: np.ndarray  # (d_mlp, op) bool: the statistics come from exact patching
    rank_value: Float[np.ndarray, "d_mlp op"]  # the config's ranking statistic, signed
    constant: np.ndarray  # (d_mlp, op) bool: no variance over the operator's valid cells
    rank: np.ndarray  # (d_mlp, op) int32, 0 = first by the config's rank rule
    matches: Matches
    # op -> {"n_exact": neurons with exact effects, "spearman": attribution vs exact on them}
    patching: dict[str, dict]
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per phase
    # op -> {"labelled", "n"}: the label rule on a sample of this layer's maps whose values
    # are relabelled at random (a control that needs no untrained checkpoint)
    label_control: dict[str, dict] = field(default_factory=dict)
    # periodic structure of every (neuron, operator) map (catalog.periodic.spectra); None: not run
    spectra: LayerSpectra | None = None
    # per labelled (neuron, operator): held-out R^2 of each competing explanation of its K
    # and KV maps (catalog.labels.operator_labels.FIT_COLS, FIT_OP_COLS -> (d_mlp, op) arrays; NaN
    # or '' where not labelled); None: the config's result_beyond_operands is off
    explanations: dict[str, np.ndarray] | None = None

    def effect(self, sign: str) -> np.ndarray:
        """What circuits order neurons by, largest first (catalog.measuring.effects.rank_key)."""
        return effects.rank_key(self.rank_value, sign)

    def attribution_score(self) -> np.ndarray | None:
        """(d_mlp, op): the heuristics paper's neuron ranking, attribution patching's mean
        plus its standard deviation over pairs (None without attribution)."""
        if self.effect_attr is None or self.effect_attr_std is None:
            return None
        return self.effect_attr + self.effect_attr_std

    def digest(self, sign: str) -> LayerDigest:
        """What the summary needs of this layer (``sign``: the config's rank_sign)."""
        return LayerDigest(self.effect(sign), self.matches, self.attribution_score(),
                           self.mean_act, self.mean_kv)

    def kv(self, op_prompts: np.ndarray) -> np.ndarray:
        """KV map values (d_mlp, n) for the given prompts: K times the answer's lens value."""
        return kv_map(self.acts[op_prompts].T, self.answer_lens[:, op_prompts])


@dataclass
class Summary:
    """Checkpoint-level results."""

    accuracy: dict[str, float]
    n_correct: dict[str, int]
    n_pairs: dict[str, int]
    circuit_sizes: list[int]
    # op -> [(k, F)]: the first protocol's ranked curve, the well-conditioned statistic:
    # the ratio of the paper's normalised logit's means over the prompts
    # (catalog.circuits.faithfulness); the paper's mean of per-prompt ratios is beside it
    faithfulness: dict[str, list[tuple[int, float]]]
    heuristic_knockouts: list[dict]
    prompt_knockouts: dict[str, dict]
    n_heuristic_neurons: dict[str, int]  # op -> neurons labelled with a heuristic
    layers: list[int]  # the layers the summary covers (circuits span these only)
    n_excluded: dict[str, int]  # op -> correct prompts left out because a shot solves them
    components: dict[str, ComponentEffects] = field(default_factory=dict)  # op ->
    curves: list[paper.CurveResult] = field(default_factory=list)  # protocol x operator
    # op -> [(k, F)]: the same curve as the paper's mean of per-prompt ratios, which one
    # prompt with a tiny denominator can move: shown beside the headline, never alone
    faithfulness_mean_ratio: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    residual_lens: dict[str, dict] = field(default_factory=dict)  # op -> per-layer lists
    # labelled share of the top set against a random set and the layer (catalog.labels.enrichment)
    enrichment: list[dict] = field(default_factory=list)
    # op -> heuristic key -> labels of the heuristics with the same cells (not scored)
    aliases: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    # op -> the direct decomposition of each prompt's answer over the labelled neurons,
    # aggregated over the knockout's prompts (catalog.explain.grid.summarize_prompts)
    prompt_explanations: dict[str, dict] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # phase -> wall time
    # a later checkpoint's circuit measured here (catalog.circuits.final): protocol "final",
    # its ranked curve and random control per operator; final_step is that checkpoint's step
    final_curves: list[paper.CurveResult] = field(default_factory=list)
    final_step: int | None = None


@dataclass
class GridLayout:
    """How one operator's grid maps back to operands: its valid cells in a side x side
    square starting at lo, and each valid cell's answer position on the lens axis."""

    op: str
    lo: int
    side: int
    valid: np.ndarray  # (side * side,) bool
    answer_index: np.ndarray  # (n_valid,) int32, into number_ids


@dataclass
class CheckpointResult:
    config: ScienceConfig
    numbers: NumberTokens
    table: PromptTable
    layers: dict[int, LayerResult]
    summary: Summary | None
    provenance: dict




@dataclass
class Driven:
    """What ``CheckpointRun.run_all`` returns: the layers' results (when kept), every
    layer's digest and the summary (None when not asked for)."""

    results: dict[int, LayerResult]
    digests: dict[int, LayerDigest]
    summary: Summary | None
    summary_seconds: float = 0.0
