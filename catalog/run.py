"""One object runs one checkpoint's measurement from start to end: ``CheckpointRun``.

Every way of filling the catalog drives it the same way:

    run = CheckpointRun(model, tokenizer, science, execution)
    run.prepare()                    # prompts, grid pass, counterfactual pairs, heuristics
    for layer in run.layers:
        result = run.run_layer(layer)   # grids, lens, patching, heuristic matches
        ...store or keep result...
        run.release(layer)           # drop the layer's activations if over the budget
    summary = run.summarize(effects, matches, attribution=...)  # accuracy, circuits, knockouts

``catalog.measure`` keeps every result in memory, ``ncat catalog`` stores each layer as it
goes, and a Celery worker runs one layer per task (its matches may come back from the
database through ``Matches.from_records``). Nothing here touches storage.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from jaxtyping import Float
from transformer_lens import HookedTransformer

from catalog import ablation, circuits, effects, enrichment, knockouts, nulls
from catalog import effects as effects_mod
from catalog.builtin.model import BUILTIN_NAME
from catalog.components import ComponentEffects, component_effects, residual_lens
from catalog.config import CATALOG_VERSION, ExecutionConfig, ScienceConfig
from catalog.grids import PrefixRunner, accuracy_by_operator, mlp_width, run_grid
from catalog.heuristics import Cells, Heuristic, Partition, n_tests, partitions_for
from catalog.lens import LensResult, lens_at, logit_lens
from catalog.maps import kv_map
from catalog.matching import Matches, multi_result_matches, score_partitions
from catalog.patching import attribution_patching, exact_patching
from catalog.prompts import PromptTable, build_prompts, sample_pairs
from catalog.tokens import NumberTokens, continuing_ids, detect_number_tokens, number_token_ids

log = logging.getLogger(__name__)

# maps per layer and operator that the relabelled-values control scores
CONTROL_MAPS = 128


@dataclass
class LayerResult:
    """All measurements of one layer. Arrays over operators use config.operators order."""

    layer: int
    acts: Float[np.ndarray, "prompt d_mlp"]  # K maps, prompts in table order
    lens: LensResult
    answer_lens: Float[np.ndarray, "d_mlp prompt"]  # lens value of each prompt's answer token
    max_act: Float[np.ndarray, "d_mlp op"]
    mean_act: Float[np.ndarray, "d_mlp op"]
    density: Float[np.ndarray, "d_mlp op"]  # share of the operator's prompts with act > 0
    effect_exact: Float[np.ndarray, "d_mlp op"] | None  # the paper's mean; NaN if not exact
    effect_exact_std: Float[np.ndarray, "d_mlp op"] | None
    effect_attr: Float[np.ndarray, "d_mlp op"] | None
    effect_attr_std: Float[np.ndarray, "d_mlp op"] | None
    # robust statistics of the log-space effect (catalog.effects), exact where measured
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

    def effect(self, sign: str) -> np.ndarray:
        """What circuits order neurons by, largest first (catalog.effects.rank_key)."""
        return effects.rank_key(self.rank_value, sign)

    def attribution_score(self) -> np.ndarray | None:
        """(d_mlp, op): the heuristics paper's neuron ranking, attribution patching's mean
        plus its standard deviation over pairs (None without attribution)."""
        if self.effect_attr is None or self.effect_attr_std is None:
            return None
        return self.effect_attr + self.effect_attr_std

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
    # op -> [(k, F)]: the first protocol's ranked curve, the paper's NL mean of ratios
    faithfulness: dict[str, list[tuple[int, float]]]
    heuristic_knockouts: list[dict]
    prompt_knockouts: dict[str, dict]
    n_heuristic_neurons: dict[str, int]  # op -> neurons labelled with a heuristic
    layers: list[int]  # the layers the summary covers (circuits span these only)
    n_excluded: dict[str, int]  # op -> correct prompts left out because a shot solves them
    components: dict[str, ComponentEffects] = field(default_factory=dict)  # op ->
    curves: list[circuits.CurveResult] = field(default_factory=list)  # protocol x operator
    residual_lens: dict[str, dict] = field(default_factory=dict)  # op -> per-layer lists
    # labelled share of the top set against a random set and the layer (catalog.enrichment)
    enrichment: list[dict] = field(default_factory=list)
    # op -> heuristic key -> labels of the heuristics with the same cells (not scored)
    aliases: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # phase -> wall time


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


def check_layers(model: HookedTransformer, layers: list[int] | None) -> list[int]:
    """All layers when None; otherwise validate and sort."""
    n = model.cfg.n_layers
    if layers is None:
        return list(range(n))
    layers = sorted(set(int(x) for x in layers))
    if not layers:
        raise ValueError("layers is empty; give at least one layer index")
    bad = [x for x in layers if not 0 <= x < n]
    if bad:
        raise ValueError(f"layers {bad} do not exist; this model has layers 0..{n - 1}")
    return layers


class _Clock:
    """Wall time per phase of one layer (``LayerResult.seconds``)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def time(self, phase: str, fn, *args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t


CONSTANT_RTOL = 1e-6  # a map whose range is below this share of its size is constant


def constant_maps(k_map: np.ndarray) -> np.ndarray:
    """(neurons,) bool: maps with no variance over the cells (dead or constant neurons)."""
    hi, lo = k_map.max(1), k_map.min(1)
    size = np.maximum(np.abs(hi), np.abs(lo))
    return (hi - lo) <= CONSTANT_RTOL * size


class CheckpointRun:
    """The measurement of one (model, checkpoint, science config); see the module docstring.

    ``layers`` (default all) are the layers this run will measure; their activations
    are captured in the one grid pass when they fit in ``execution.activation_budget``,
    else each layer's grid is computed when the layer runs. The config is checked
    against the tokenizer here, before any forward pass.
    """

    table: PromptTable
    pairs: dict[str, tuple[np.ndarray, np.ndarray]]  # op -> (clean, counterfactual)
    cells: dict[str, Cells]
    partitions: dict[str, list[Partition]]
    number_ids: np.ndarray

    def __init__(self, model: HookedTransformer, tokenizer, config: ScienceConfig | None = None,
                 execution: ExecutionConfig | None = None,
                 layers: list[int] | None = None) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.config = config or ScienceConfig()
        self.execution = execution or ExecutionConfig()
        # a float64 model may stand in for float32 (the tests' precise references); any
        # other mismatch would store numbers under the wrong config
        have = next(model.parameters()).dtype
        if have != self.config.torch_dtype() and not (
                have == torch.float64 and self.config.dtype == "float32"):
            raise ValueError(
                f"the model's weights are {str(have).removeprefix('torch.')} but the config "
                f"asks for dtype {self.config.dtype}; load it with "
                f"load_model(..., dtype=config.torch_dtype())")
        self.d_mlp = mlp_width(model)
        self.layers: list[int] = check_layers(model, layers)
        late = self.config.late_from
        if late != "auto" and int(late) >= model.cfg.n_layers:
            raise ValueError(f"late_from {late} is not a layer of this model; it has layers "
                             f"0..{model.cfg.n_layers - 1}")
        self.numbers = detect_number_tokens(self.tokenizer,
                                            prepend_bos=self.model.cfg.default_prepend_bos)
        self.config.check_tokens(self.numbers)
        self._acts: dict[int, np.ndarray] = {}
        # op -> layer -> (d_mlp, pairs) attribution of every run layer, from one backward pass
        self._attribution: dict[str, dict[int, np.ndarray]] = {}
        self._prepared = False

    # ------------------------------------------------------------ preparation

    def prepare(self, progress: bool = False) -> CheckpointRun:
        """Build prompts, run the grid pass (correctness, and activations of the layers that
        fit the budget), draw counterfactual pairs, build the heuristics of each operator."""
        config = self.config
        self.table = build_prompts(self.tokenizer, self.numbers, config)
        self._attribution = {}
        # over the budget, the first pass only judges correctness; each layer's grid is then
        # computed when that layer runs and dropped once it is done (release)
        capture = self.layers if self._all_fit() else []
        # the built-in model is trained to emit the answer token and nothing after it
        self._continuing = (None if self.model.cfg.model_name == BUILTIN_NAME
                            else continuing_ids(self.tokenizer))
        self._acts = run_grid(self.model, self.table, capture,
                              batch_size=self.execution.batch_size, progress=progress,
                              continuing=self._continuing)
        self.pairs = {op: sample_pairs(self.table, op, config.pairs_per_op, config.seed)
                      for op in config.operators}
        self.cells, self.partitions, self.n_tests, self.nulls = {}, {}, {}, {}
        self._control: dict[str, tuple] = {}  # op -> the relabelled-values control's setup
        for op in config.operators:
            idx = self.table.op_index(op)
            t = self.table
            self.cells[op] = Cells(op, t.a[idx], t.b[idx], t.result[idx], t.lo, t.hi)
            self.partitions[op] = partitions_for(self.cells[op], config)
            self.n_tests[op] = n_tests(self.partitions[op], self._with_bottom(),
                                       self._multi_result(op))
            if config.label_rule == "values":
                self.nulls[op] = nulls.ValueNull.of(
                    self.cells[op], self.partitions[op], config.null_strata, config.seed,
                    config.pattern_top_k, self.n_tests[op], config.significance_level)
                self.n_tests[op] = nulls.n_value_tests(self.nulls[op], self.partitions[op],
                                                       self._with_bottom(),
                                                       config.significance_level)
        self.number_ids = number_token_ids(self.tokenizer, min(self.numbers.limit, 10_000))
        self._prepared = True
        return self

    def _all_fit(self) -> bool:
        n_prompts = len(self.config.operators) * (self.config.operand_hi
                                                  - self.config.operand_lo) ** 2
        need = n_prompts * len(self.layers) * self.d_mlp * 4
        return need <= self.execution.activation_budget

    def _require_prepared(self) -> None:
        if not self._prepared:
            raise RuntimeError("call CheckpointRun.prepare() first")

    def grid_layouts(self) -> list[GridLayout]:
        """Each operator's valid-cell mask and answer positions (how grids map to a, b)."""
        self._require_prepared()
        where = {int(t): i for i, t in enumerate(self.number_ids)}
        out = []
        for op in self.config.operators:
            idx = self.table.op_index(op)
            valid = np.zeros(self.table.side * self.table.side, dtype=bool)
            valid[self.table.cell_index(idx)] = True
            answer = np.array([where[int(t)] for t in self.table.answer[idx]], dtype=np.int32)
            out.append(GridLayout(op, self.table.lo, self.table.side, valid, answer))
        return out

    def activations(self, layer: int) -> np.ndarray:
        """(n_prompts, d_mlp) activations of ``layer`` at the last position."""
        self._require_prepared()
        if layer not in self._acts:
            self._acts.update(run_grid(self.model, self.table, [layer],
                                       batch_size=self.execution.batch_size,
                                       continuing=self._continuing))
        return self._acts[layer]

    def release(self, layer: int) -> None:
        """Forget ``layer``'s activations unless every layer's fit in the budget."""
        if sum(a.nbytes for a in self._acts.values()) > self.execution.activation_budget:
            self._acts.pop(layer, None)

    @property
    def held_layers(self) -> list[int]:
        """Layers whose activations are in memory now."""
        return sorted(self._acts)

    # ------------------------------------------------------------ one layer

    def _with_bottom(self) -> bool:
        if self.config.score_bottom == "always":
            return True
        if self.config.score_bottom == "never":
            return False
        return bool(self.model.cfg.gated_mlp)

    def run_layer(self, layer: int) -> LayerResult:
        """Every measurement of one layer."""
        self._require_prepared()
        if layer not in self.layers:
            raise ValueError(f"layer {layer} is not one of this run's layers {self.layers}")
        config, table, model = self.config, self.table, self.model
        shape = (self.d_mlp, len(config.operators))
        out = {name: np.full(shape, np.nan, dtype=np.float32)
               for name in ("max", "mean", "density", "exact", "exact_std", "attr", "attr_std",
                            "log", "median", "trimmed", "moved", "rank_value")}
        is_exact = np.zeros(shape, dtype=bool)
        constant = np.zeros(shape, dtype=bool)
        clock = _Clock()
        acts = clock.time("activations", self.activations, layer)
        lens = clock.time("lens", logit_lens, model, layer, self.number_ids,
                          k=config.lens_top_k)
        answer_lens = clock.time("lens", lens_at, model, layer, table.answer)
        parts, patching, control = [], {}, {}
        for o, op in enumerate(config.operators):
            idx = table.op_index(op)
            k_map = acts[idx].T  # (d_mlp, cells)
            out["max"][:, o] = k_map.max(1)
            out["mean"][:, o] = k_map.mean(1)
            out["density"][:, o] = (k_map > 0).mean(1)
            constant[:, o] = constant_maps(k_map)
            patching[op] = self._patch_op(layer, op, o, acts, out, is_exact, clock)
            # constant (dead) neurons are never labelled, so they are not scored at all
            live = np.nonzero(~constant[:, o])[0]
            m = Matches.empty()
            if len(live):
                kv = kv_map(k_map[live], answer_lens[live][:, idx])
                orders: dict = {}
                m = Matches.concat(clock.time("matching", self._match, o, op, k_map[live], kv,
                                              orders))
                dev = self.model.cfg.device
                m = clock.time("significance", nulls.label, m, config, self.n_tests[op],
                               self.nulls.get(op), torch.as_tensor(k_map[live], device=dev),
                               torch.as_tensor(kv, device=dev), orders)
                control[op] = clock.time("significance", self._label_control, layer, o, op,
                                         k_map[live], kv)
                m.neuron = live[m.neuron].astype(np.int32)
            parts.append(m)
        rank = effects.ranks(effects.rank_key(out["rank_value"], config.rank_sign))
        exact, attr = "exact" in config.patching, "attribution" in config.patching
        return LayerResult(
            layer=layer, acts=acts, lens=lens, answer_lens=answer_lens,
            max_act=out["max"], mean_act=out["mean"], density=out["density"],
            effect_exact=out["exact"] if exact else None,
            effect_exact_std=out["exact_std"] if exact else None,
            effect_attr=out["attr"] if attr else None,
            effect_attr_std=out["attr_std"] if attr else None,
            effect_log=out["log"], effect_median=out["median"], effect_trimmed=out["trimmed"],
            moved_share=out["moved"], is_exact=is_exact, rank_value=out["rank_value"],
            constant=constant, rank=rank, matches=Matches.concat(parts), patching=patching,
            seconds=clock.seconds, label_control=control,
        )

    def _patch_op(self, layer: int, op: str, o: int, acts: np.ndarray, out: dict,
                  is_exact: np.ndarray, clock: _Clock) -> dict:
        """Patching of one operator (docs/method.md section 5): attribution for every
        neuron, exact for all, none or the top N by |attribution| (``config.exact``). Fills
        column ``o`` of ``out``; returns the operator's patching facts."""
        config, model, table = self.config, self.model, self.table
        clean, cf = self.pairs[op]
        stat = config.rank_statistic
        facts: dict = {"n_pairs": int(len(clean)), "n_exact": 0, "spearman": None}
        if not len(clean):
            return facts
        attr_stats = None
        if "attribution" in config.patching:
            if op not in self._attribution:  # every layer of the run in one backward pass
                self._attribution[op] = clock.time(
                    "attribution", attribution_patching, model, table, self.layers, clean,
                    None, cf)
            per_pair = self._attribution[op][layer]
            attr_stats = effects.PairStats.of(per_pair)
            out["attr"][:, o], out["attr_std"][:, o] = attr_stats.mean, attr_stats.std
            for name, v in (("log", attr_stats.log_mean), ("median", attr_stats.median),
                            ("trimmed", attr_stats.trimmed), ("moved", attr_stats.moved),
                            ("rank_value", attr_stats.log_mean if stat == "mean"
                             else attr_stats.statistic(stat))):
                out[name][:, o] = v
        if "exact" not in config.patching:
            return facts
        top = config.exact_top()
        if top is None:
            neurons = np.arange(self.d_mlp)
        else:
            assert attr_stats is not None  # the config asks for attribution with top:N
            key = effects.rank_key(attr_stats.log_mean if stat == "mean"
                                   else attr_stats.statistic(stat), "abs")
            neurons = np.sort(np.argsort(-key, kind="stable")[:min(top, self.d_mlp)])
        paper, log = clock.time("exact", exact_patching, model, table, layer, clean, cf,
                                acts[cf], chunk=self.execution.patch_chunk, neurons=neurons,
                                with_log=True)
        ex = effects.PairStats.of(log, paper)
        out["exact"][neurons, o], out["exact_std"][neurons, o] = ex.mean, ex.std
        for name, v in (("log", ex.log_mean), ("median", ex.median), ("trimmed", ex.trimmed),
                        ("moved", ex.moved), ("rank_value", ex.statistic(stat))):
            out[name][neurons, o] = v
        is_exact[neurons, o] = True
        facts["n_exact"] = int(len(neurons))
        if attr_stats is not None:
            a = attr_stats.log_mean if stat == "mean" else attr_stats.statistic(stat)
            rho = effects.spearman(a[neurons], ex.log_mean if stat == "mean"
                                   else ex.statistic(stat))
            facts["spearman"] = None if np.isnan(rho) else rho
        return facts

    def _label_control(self, layer: int, o: int, op: str, k_map: np.ndarray,
                       kv: np.ndarray) -> dict:
        """The label rule on up to ``CONTROL_MAPS`` of the layer's live maps scored against
        heuristics whose operand and result values are relabelled at random (within the
        null's strata): how often maps of THIS model get labels for values they cannot be
        about. The report shows it where the model has no untrained checkpoint."""
        config = self.config
        gen = np.random.default_rng([config.seed, layer, o, 1])
        pick = np.sort(gen.choice(len(k_map), min(CONTROL_MAPS, len(k_map)), replace=False))
        if op not in self._control:  # one relabelling per operator, for every layer
            cells = nulls.relabelled(self.cells[op], config.null_strata,
                                     np.random.default_rng([config.seed, o, 1]))
            parts = partitions_for(cells, config)
            m_tests = n_tests(parts, self._with_bottom(), self._multi_result(op))
            null = None
            if config.label_rule == "values":
                null = nulls.ValueNull.of(cells, parts, config.null_strata, config.seed,
                                          config.pattern_top_k, m_tests,
                                          config.significance_level)
                m_tests = nulls.n_value_tests(null, parts, self._with_bottom(),
                                              config.significance_level)
            self._control[op] = (cells, parts, null, m_tests)
        cells, parts, null, m_tests = self._control[op]
        dev = self.model.cfg.device
        k_t = torch.as_tensor(k_map[pick], device=dev)
        kv_t = torch.as_tensor(kv[pick], device=dev)
        orders: dict = {}
        m = score_partitions(k_t, kv_t, parts, config.score_floor, self._with_bottom(),
                             config.pattern_top_k, cells=cells, orders=orders)
        m = nulls.label(m, config, m_tests, null, k_t, kv_t, orders)
        return {"labelled": int(len(np.unique(m.neuron[m.implements]))), "n": int(len(pick))}

    def _multi_result(self, op: str) -> bool:
        return op == "/" and "multi_result" in self.config.families

    def _match(self, o: int, op: str, k_map: np.ndarray, kv: np.ndarray,
               orders: dict | None = None) -> list[Matches]:
        """Scores of the live maps of one operator; ``orders`` receives each side's sort
        order (the label rule reuses them)."""
        config, dev = self.config, self.model.cfg.device
        idx = self.table.op_index(op)
        out = [score_partitions(torch.as_tensor(k_map, device=dev), torch.as_tensor(kv, device=dev),
                                self.partitions[op], config.score_floor, self._with_bottom(),
                                config.pattern_top_k, cells=self.cells[op], op=o,
                                orders=orders)]
        if self._multi_result(op):
            out.append(multi_result_matches(torch.as_tensor(kv), self.table.result[idx],
                                            top=config.multi_result_top,
                                            floor=config.score_floor, op=o))
        return out

    # ------------------------------------------------------------ the checkpoint

    def summarize(self, effects: dict[int, np.ndarray], matches: dict[int, Matches],
                  run_knockouts: bool = True,
                  attribution: dict[int, np.ndarray | None] | None = None) -> Summary:
        """Checkpoint summary from the measured layers' rank keys (d_mlp, op; largest
        first, ``LayerResult.effect``), their attribution scores (``LayerResult.
        attribution_score``, what a paper circuit ranks by) and labelled matches.

        Component effects per operator, then each of the config's faithfulness protocols'
        curves (docs/method.md section 6), then the knockouts. Circuits span the layers
        given: the others are never pruned, and the summary records which layers it
        covers and, per protocol, which it pruned and which it kept whole.
        """
        self._require_prepared()
        model, config, table = self.model, self.config, self.table
        n_layers, d_mlp = model.cfg.n_layers, self.d_mlp
        layers = sorted(effects)
        if not layers:
            raise ValueError("summarize needs at least one measured layer")
        measured = np.zeros(n_layers, dtype=bool)
        measured[layers] = True
        runner = PrefixRunner(model, table)  # one prefix and context cache for the summary
        draws = self._faithfulness_draws()
        seconds: dict[str, float] = {}
        t = time.perf_counter()
        comps = {op: component_effects(model, table, *self.pairs[op], config.component_positions,
                                       config.rank_statistic, runner, self._exact_heads())
                 for op in config.operators} if config.component_positions else {}
        lens = {op: residual_lens(model, table, draws[op][0] if draws[op] else
                                  np.zeros(0, np.int64), runner) for op in config.operators}
        seconds["component effects and residual lens"] = time.perf_counter() - t
        curves = self._curves(effects, attribution or {}, comps, draws, layers, seconds)
        t = time.perf_counter()
        first = [c for c in curves if c.protocol == config.faithfulness_protocols[0]]
        faith = {c.op: [(k, v if v is not None else float("nan")) for k, v in c.curve()]
                 for c in first}
        h_knock, p_knock = [], {}
        top_k = circuits.circuit_sizes(d_mlp, (config.top_set_fraction,))[0]
        for o, op in enumerate(config.operators):
            prompts = np.unique(np.concatenate(draws[op])) if draws[op] else np.zeros(0, int)
            if not run_knockouts or len(prompts) == 0:
                continue
            eff = np.full((n_layers, d_mlp), -np.inf)
            for layer in layers:
                eff[layer] = np.nan_to_num(effects[layer][:, o], nan=-np.inf)
            top_set = circuits.top_k_mask(eff, top_k) & measured[:, None]
            ranked = self._heuristic_masks(o, matches, top_set)
            for h, mask in ranked[:20]:
                row = knockouts.heuristic_knockout(model, table, prompts, h, mask & top_set,
                                                   runner)
                if row["n_neurons"]:
                    h_knock.append({"op": op, **row})
            p_knock[op] = knockouts.prompt_knockout(
                model, table, prompts, [h for h, _ in ranked], [m for _, m in ranked], top_set,
                config.knockout_neurons, config.seed, runner)
        correct_all = table.correct
        assert correct_all is not None and table.is_shot is not None
        return Summary(
            accuracy=accuracy_by_operator(table),
            n_correct={op: int(correct_all[table.op_index(op)].sum())
                       for op in config.operators},
            n_pairs={op: len(self.pairs[op][0]) for op in config.operators},
            circuit_sizes=sorted({k for c in first for k, _ in c.curve()}),
            faithfulness=faith, heuristic_knockouts=h_knock, prompt_knockouts=p_knock,
            n_heuristic_neurons={
                op: sum(len(m.neurons_matching(o)) for m in matches.values())
                for o, op in enumerate(config.operators)},
            layers=layers,
            n_excluded={op: int((correct_all & table.is_shot)[table.op_index(op)].sum())
                        for op in config.operators},
            components=comps, curves=curves, residual_lens=lens,
            aliases={op: {h.key: list(h.aliases) for p in self.partitions[op]
                          for h in p.heuristics if h.aliases} for op in config.operators},
            enrichment=enrichment.enrichment(
                {layer: effects_mod.ranks(np.nan_to_num(effects[layer], nan=-np.inf))
                 for layer in layers},
                {layer: enrichment.label_masks(matches[layer], d_mlp, len(config.operators))
                 for layer in layers if layer in matches},
                config.operators, config.top_set_fraction, config.seed),
            seconds={**seconds, "knockouts": time.perf_counter() - t},
        )

    def _exact_heads(self) -> int | None:
        """How many heads component effects patch exactly (None: every head)."""
        setting = self.config.component_exact_heads
        if setting == "all":
            return None
        if setting == "auto":
            cfg = self.model.cfg
            return 2 * circuits.heads_to_keep(cfg.n_layers, cfg.n_heads, self.config.heads_kept)
        return int(setting)

    def _faithfulness_draws(self) -> dict[str, list[np.ndarray]]:
        """op -> per seed, the correct prompts drawn for faithfulness (sorted). One
        generator across operators and seeds, so a single seed draws what the catalog
        drew before seeds existed."""
        config, table = self.config, self.table
        rng = np.random.default_rng([config.seed, 7])
        usable = table.usable()
        out: dict[str, list[np.ndarray]] = {}
        for op in config.operators:
            correct = table.op_index(op)[usable[table.op_index(op)]]
            out[op] = [np.sort(rng.choice(correct, min(len(correct), config.faithfulness_prompts),
                                          replace=False))
                       for _ in range(config.faithfulness_seeds)] if len(correct) else []
        return out

    def _counterfactuals(self, prompts: np.ndarray) -> dict[int, int]:
        """prompt -> a correct prompt of any operator whose own part has the same number of
        tokens and whose answer differs (the prompt itself when there is none): the
        counterfactual answer of the logit-difference metric and the source of the
        counterfactual protocol's activations."""
        table = self.table
        rng = np.random.default_rng([self.config.seed, 8])
        usable = np.nonzero(table.usable())[0]
        own = np.array([len(table.tokens[i]) - table.prefix_len(i) for i in range(len(table))])
        out = {}
        for p in np.unique(prompts):
            pool = usable[(own[usable] == own[p]) & (table.answer[usable] != table.answer[p])]
            out[int(p)] = int(pool[rng.integers(len(pool))]) if len(pool) else int(p)
        return out

    def _curves(self, effects: dict[int, np.ndarray], attribution: dict[int, np.ndarray | None],
                comps: dict[str, ComponentEffects], draws: dict[str, list[np.ndarray]],
                layers: list[int], seconds: dict[str, float]) -> list[circuits.CurveResult]:
        """Every protocol's faithfulness curve for every operator; the wall time of each
        protocol's (its means included) is added to ``seconds``."""
        model, config, table = self.model, self.config, self.table
        n_layers, d_mlp = model.cfg.n_layers, self.d_mlp
        every = np.concatenate([np.concatenate(d) for d in draws.values() if d] or
                               [np.zeros(0, np.int64)])
        cf_of = self._counterfactuals(every)
        means: dict[tuple[str, str, int], ablation.Means] = {}

        def mean_replace(population: str, context: str, cap: int) -> ablation.Replace:
            key = (population, context, cap)
            if key not in means:
                pop = ablation.mean_population(self.tokenizer, table, config, population, cap,
                                               config.seed)
                means[key] = ablation.position_means(model, pop, context,
                                                     self.execution.batch_size)
            return ablation.mean_replacement(means[key])

        mlp_last = None
        if comps:
            mlp_last = np.nanmean(np.stack([c.mlp_last(config.rank_sign)
                                            for c in comps.values()]), axis=0)
        out = []
        for o, op in enumerate(config.operators):
            setup = circuits.CurveSetup(
                table=table, width=d_mlp, fractions=tuple(config.circuit_fractions),
                counts=config.counts(d_mlp), seeds=draws[op], cf_of=cf_of, seed=config.seed,
                batch_size=self.execution.batch_size)
            key = np.full((n_layers, d_mlp), -np.inf)
            paper_score = np.full((n_layers, d_mlp), -np.inf)
            for layer in layers:
                key[layer] = np.nan_to_num(effects[layer][:, o], nan=-np.inf)
                a = attribution.get(layer)
                if a is not None:
                    paper_score[layer] = np.nan_to_num(a[:, o], nan=-np.inf)
            ranked_by = config.circuit_ranking
            if ranked_by == "auto":
                ranked_by = "attribution" if any(a is not None for a in attribution.values()) \
                    else "rank"
            score = paper_score if ranked_by == "attribution" else key
            for protocol in config.faithfulness_protocols:
                t = time.perf_counter()
                plan = circuits.plan(protocol, model, layers, score, key, comps.get(op),
                                     config.late_from, config.heads_kept, config.rank_sign,
                                     model.cfg.model_name, mlp_last)
                if protocol == "all-layers":  # the catalog's protocol before 0.5.0
                    (population, context, cap), = dataclasses.replace(
                        config, faithfulness_protocols=(protocol,)).mean_passes()
                    replace, ranking = mean_replace(population, context, cap), "rank"
                elif protocol == "counterfactual":
                    replace = ablation.counterfactual_replacement(
                        model, table, cf_of, self.execution.batch_size)
                    context, population, ranking = "prompt", None, ranked_by
                else:
                    context, population = config.ablate_context, config.mean_population
                    replace = mean_replace(population, context, config.mean_prompts)
                    ranking = ranked_by
                out.append(circuits.measure_curve(model, setup, op, plan, replace, context,
                                                  population, ranking))
                name = f"curve, {protocol}"
                seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t
        return out

    def _heuristic_masks(self, o: int, matches: dict[int, Matches], top_set: np.ndarray,
                         ) -> list[tuple[Heuristic, np.ndarray]]:
        """(heuristic, (n_layers, d_mlp) mask of its neurons) for operator index ``o``,
        heuristics with more top-set neurons first (then by key)."""
        n_layers, d_mlp = self.model.cfg.n_layers, self.d_mlp
        by_h: dict[str, tuple[Heuristic, np.ndarray]] = {}
        for layer, m in matches.items():
            sel = (m.op == o) & m.implements
            for n, i in zip(m.neuron[sel], np.nonzero(sel)[0], strict=True):
                h = m.row_heuristic(int(i))
                if h.key not in by_h:
                    by_h[h.key] = (h, np.zeros((n_layers, d_mlp), dtype=bool))
                by_h[h.key][1][layer, n] = True
        return sorted(by_h.values(), key=lambda x: (-int((x[1] & top_set).sum()), x[0].key))

    def provenance(self, extra: dict | None = None) -> dict:
        return {"catalog_version": CATALOG_VERSION, "config_hash": self.config.config_hash(),
                "numbers": self.numbers.as_dict(), **(extra or {})}
