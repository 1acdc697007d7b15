"""One object runs one checkpoint's measurement from start to end: ``CheckpointRun``.

Every way of filling the catalog drives it through one method:

    run = CheckpointRun(model, tokenizer, science, execution).prepare()
    out = run.run_all(on_layer=store_it)   # each layer: measure, hand over, release;
                                           # then the summary over every layer
    out.summary, out.digests, out.results  # results only with keep=True

``run_all`` measures each layer (``run_layer``: grids, lens, patching, heuristic
matches), hands the ``LayerResult`` to ``on_layer`` (``ncat catalog`` stores it, the
planner times it), keeps its ``LayerDigest`` (what the summary needs) and drops the
layer's activations when they are over the budget (``release``); layers measured before
(``done``: digests read back from a store) are not run again. Then ``summarize``
(``catalog.run.summarize``): accuracy, circuits, knockouts, enrichment. ``catalog.measure``
keeps every result in memory; a Celery worker runs one layer per task with
``run_layer`` and summarizes from digests that may come back from the database. Nothing
here touches storage.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

import numpy as np
import torch
from transformer_lens import HookedTransformer

from catalog.builtin.model import BUILTIN_NAME
from catalog.circuits.final import FinalCircuit
from catalog.config import CATALOG_VERSION, ExecutionConfig, ScienceConfig
from catalog.config.settings import get_settings
from catalog.core import stats
from catalog.core.maps import kv_map
from catalog.core.progress import progress_bar
from catalog.core.tokens import continuing_ids, detect_number_tokens, number_token_ids
from catalog.labels import controls, operator_labels, value_null
from catalog.labels.families import chosen_on
from catalog.labels.heuristics import Cells, Partition, n_tests, partitions_for, rescue_pairs
from catalog.labels.matches import Matches
from catalog.labels.matching import score_partitions
from catalog.labels.operand_fit import OperandFit
from catalog.measuring import effects
from catalog.measuring.grids import mlp_width, run_grid
from catalog.measuring.lens import lens_at, logit_lens
from catalog.measuring.patching import attribution_patching, exact_patching
from catalog.measuring.prompts import PromptTable, check_context, prompts_for, sample_pairs
from catalog.periodic import spectra
from catalog.run.results import (
    CheckpointResult,
    Driven,
    GridLayout,
    LayerDigest,
    LayerResult,
    LayerStats,
    Summary,
)
from catalog.run.summarize import CheckpointSummary

__all__ = ["CheckpointResult", "CheckpointRun", "Driven", "GridLayout", "LayerDigest",
           "LayerResult", "Summary", "check_layers", "constant_maps"]

log = logging.getLogger(__name__)



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


class CheckpointRun(CheckpointSummary):
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
        self.table = prompts_for(self.tokenizer, self.numbers, config)
        check_context(max(len(t) for t in self.table.tokens), self.model.cfg.n_ctx, config,
                      self.model.cfg.model_name)
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
        # the spectra's null draws depend on the cells and the seed alone: kept on disk
        # for the next checkpoint (catalog.periodic.spectra.cached_op_nulls)
        self._null_cache = get_settings().ncat_home / "spectra-nulls" if config.spectra else None
        # op -> the operands' additive fit and each operator's result on its cells
        self.fits: dict[str, OperandFit] = {}
        for op in config.operators:
            idx = self.table.op_index(op)
            t = self.table
            self.cells[op] = Cells(op, t.a[idx], t.b[idx], t.result[idx], t.lo, t.hi)
            if operator_labels.gated(config):
                self.fits[op] = operator_labels.operand_fit(config, self.cells[op],
                                                            self.model.cfg.device)
            self.partitions[op] = partitions_for(self.cells[op], config)
            self.n_tests[op] = n_tests(self.partitions[op], self.with_bottom,
                                       self._multi_result(op))
            if config.label_rule == "values":
                self.nulls[op] = value_null.ValueNull.of(
                    self.cells[op], self.partitions[op], config.null_strata, config.seed,
                    config.pattern_top_k, self.n_tests[op], config.significance_level)
                self.n_tests[op] = value_null.n_value_tests(self.nulls[op], self.partitions[op],
                                                       self.with_bottom,
                                                       config.significance_level)
        self._controls = controls.LabelControls(
            config, self.cells, self.partitions, self.n_tests, self.nulls, self.fits,
            self.with_bottom, {op: self._multi_result(op) for op in config.operators},
            self.tokenizer, self.model.cfg.device)
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

    @property
    def with_bottom(self) -> bool:
        """Whether the bottom of each map is scored too (``ScienceConfig.scores_bottom``)."""
        return self.config.scores_bottom(self.model.cfg.gated_mlp)

    def run_layer(self, layer: int) -> LayerResult:
        """Every measurement of one layer."""
        self._require_prepared()
        if layer not in self.layers:
            raise ValueError(f"layer {layer} is not one of this run's layers {self.layers}")
        config, table, model = self.config, self.table, self.model
        shape = (self.d_mlp, len(config.operators))
        out = LayerStats.empty(*shape)
        clock = _Clock()
        acts = clock.time("activations", self.activations, layer)
        lens = clock.time("lens", logit_lens, model, layer, self.number_ids,
                          k=config.lens_top_k)
        answer_lens = clock.time("lens", lens_at, model, layer, table.answer)
        parts, patching, control = [], {}, {}
        spec = spectra.LayerSpectra.empty(*shape)
        fits = operator_labels.fit_columns(*shape)
        for o, op in enumerate(config.operators):
            idx = table.op_index(op)
            k_map = acts[idx].T  # (d_mlp, cells)
            out.max_act[:, o] = k_map.max(1)
            out.mean_act[:, o] = k_map.mean(1)
            out.density[:, o] = (k_map > 0).mean(1)
            out.constant[:, o] = constant_maps(k_map)
            patching[op] = self._patch_op(layer, op, o, acts, out, clock)
            # constant (dead) neurons are never labelled, so they are not scored at all
            live = np.nonzero(~out.constant[:, o])[0]
            m = Matches.empty()
            if len(live):
                kv = kv_map(k_map[live], answer_lens[live][:, idx])
                # the KV map's mean: a result label's side is checked against it
                out.mean_kv[live, o] = kv.mean(1)
                dev = self.model.cfg.device
                k_t, kv_t = (torch.as_tensor(k_map[live], device=dev),
                             torch.as_tensor(kv, device=dev))

                def score(k, kv_scored, orders, rescue, _o=o, _op=op, _kv=kv_t):
                    return Matches.concat(self._match(_o, _op, k, kv_scored, orders,
                                                      None if rescue else _kv, rescue))
                got = operator_labels.label_operator(
                    config, k_t, kv_t, score, self.n_tests[op], self.nulls.get(op),
                    self.fits.get(op), clock.time, explain_k=self.execution.k_explanations)
                m = got.matches
                operator_labels.set_fit_columns(fits, live, o, got)
                control[op] = clock.time("significance", self._label_control, layer, o, op,
                                         k_map[live], kv)
                m.neuron = live[m.neuron].astype(np.int32)
                if config.spectra:
                    cells = self.cells[op]
                    spec.set(live, o, clock.time(
                        "spectra", spectra.op_spectra, k_map[live], kv, cells.a, cells.b,
                        cells.result, [config.seed, o], cache_dir=self._null_cache))
            parts.append(m)
        rank = effects.ranks(effects.rank_key(out.rank_value, config.rank_sign))
        exact, attr = "exact" in config.patching, "attribution" in config.patching
        return LayerResult(
            layer=layer, acts=acts, lens=lens, answer_lens=answer_lens,
            max_act=out.max_act, mean_act=out.mean_act, mean_kv=out.mean_kv,
            density=out.density,
            effect_exact=out.effect_exact if exact else None,
            effect_exact_std=out.effect_exact_std if exact else None,
            effect_attr=out.effect_attr if attr else None,
            effect_attr_std=out.effect_attr_std if attr else None,
            effect_log=out.effect_log, effect_median=out.effect_median,
            effect_trimmed=out.effect_trimmed, moved_share=out.moved_share,
            is_exact=out.is_exact, rank_value=out.rank_value,
            constant=out.constant, rank=rank, matches=Matches.concat(parts), patching=patching,
            seconds=clock.seconds, label_control=control,
            spectra=spec if config.spectra else None,
            explanations=fits if operator_labels.gated(config) else None,
        )

    def _patch_op(self, layer: int, op: str, o: int, acts: np.ndarray, out: LayerStats,
                  clock: _Clock) -> dict:
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
            out.set_effects(slice(None), o, attr_stats, attr_stats.log_mean if stat == "mean"
                            else attr_stats.statistic(stat), exact=False)
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
        out.set_effects(neurons, o, ex, ex.statistic(stat), exact=True)
        facts["n_exact"] = int(len(neurons))
        if attr_stats is not None:
            a = attr_stats.log_mean if stat == "mean" else attr_stats.statistic(stat)
            rho = stats.spearman(a[neurons], ex.log_mean if stat == "mean"
                                   else ex.statistic(stat))
            facts["spearman"] = None if np.isnan(rho) else rho
        return facts

    def _label_control(self, layer: int, o: int, op: str, k_map: np.ndarray,
                       kv: np.ndarray) -> dict:
        """The label rule's controls on this layer (``controls.LabelControls``)."""
        return self._controls.measure(layer, o, op, k_map, kv)

    def _multi_result(self, op: str) -> int:
        """How many chosen-set families (multi-result) score this operator."""
        return len(chosen_on(self.config.families, op))

    def _match(self, o: int, op: str, k_map: torch.Tensor, kv: torch.Tensor,
               orders: dict | None = None, kv_raw: torch.Tensor | None = None,
               results_only: object = False) -> list[Matches]:
        """Scores of the live maps of one operator (result heuristics on ``kv``: the KV map,
        or what is left of it beyond the operands; ``results_only``: no others, the
        partitions of ``rescue_partitions``: True or a ``Rescue``); ``orders``
        receives each side's sort order (the label rule reuses them). Multi-result sets are
        chosen on ``kv_raw`` (the KV map itself); none where it is not given."""
        config = self.config
        idx = self.table.op_index(op)
        parts, floor = self.partitions[op], config.score_floor
        if results_only:
            parts, floor = value_null.second_pass_scoring(parts, results_only,
                                                          self.nulls.get(op), config,
                                                          self.n_tests[op])
        out = [score_partitions(k_map, kv, parts, floor,
                                self.with_bottom, config.pattern_top_k, cells=self.cells[op],
                                op=o, orders=orders, pairs=rescue_pairs(results_only))]
        if kv_raw is not None:
            out += [fam.score(kv_raw.cpu(), self.table.result[idx], config, o)
                    for fam in chosen_on(config.families, op) if fam.score is not None]
        return out

    # ------------------------------------------------------------ the checkpoint

    def run_all(self, *, on_layer: Callable[[LayerResult], None] | None = None,
                done: dict[int, LayerDigest] | None = None, keep: bool = False,
                summary: bool = True, run_knockouts: bool = True, progress: bool = False,
                measure: Callable[[int], LayerResult] | None = None,
                final: FinalCircuit | None = None) -> Driven:
        """Measure every layer of the run not in ``done``, then the summary over all of
        them (see the module docstring). ``on_layer`` receives each ``LayerResult`` as it
        is measured; ``keep`` keeps them in the returned ``Driven.results``; ``measure``
        (default ``run_layer``) measures one layer, e.g. measuring and storing it in one
        step. ``final``: a later checkpoint's circuit, measured in the summary too
        (catalog.circuits.final)."""
        self._require_prepared()
        digests = dict(done or {})
        results: dict[int, LayerResult] = {}
        todo = [layer for layer in self.layers if layer not in digests]
        for layer in _layers_bar(todo, progress):
            result = (measure or self.run_layer)(layer)
            if on_layer is not None:
                on_layer(result)
            digests[layer] = result.digest(self.config.rank_sign)
            if keep:
                results[layer] = result
            del result
            self.release(layer)
        summ, seconds = None, 0.0
        if summary and digests:
            t = time.perf_counter()
            if progress:  # minutes on a real model: say what is running
                print(f"summary of {len(digests)} layer(s): accuracy, circuits and "
                      f"faithfulness curves{', knockouts' if run_knockouts else ''}...",
                      file=sys.stderr, flush=True)
            summ = self.summarize_digests(digests, run_knockouts=run_knockouts, final=final)
            seconds = time.perf_counter() - t
            if progress:
                print(f"summary done in {seconds:.1f} s", file=sys.stderr, flush=True)
        return Driven(results, digests, summ, seconds)

    def provenance(self, extra: dict | None = None) -> dict:
        return {"catalog_version": CATALOG_VERSION, "config_hash": self.config.config_hash(),
                "numbers": self.numbers.as_dict(), **(extra or {})}


def _layers_bar(todo: list[int], progress: bool):
    """Each layer of ``todo`` in turn, counted on a progress bar (lines in a log)."""
    bar = progress_bar(len(todo), "layers", "layer", enabled=progress)
    for layer in todo:
        yield layer
        bar.update(1)
    bar.close()
