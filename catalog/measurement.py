"""One entry point: measure every MLP neuron of a model checkpoint.

``measure(model, tokenizer, config)`` returns plain arrays and records, nothing
touches a database: activation grids, logit lens, exact and attribution patching
effects, heuristic scores per layer, and the checkpoint summary (accuracy,
faithfulness curve, knockouts). The job system calls the same pieces one layer
at a time (``prepare`` once, ``measure_layer`` per layer, ``summarize`` last).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch
from jaxtyping import Float
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from catalog import circuits
from catalog.config import CATALOG_VERSION, MeasureConfig
from catalog.grids import accuracy_by_operator, run_grid
from catalog.heuristics import Cells, Heuristic, Partition, partitions_for
from catalog.lens import LensResult, lens_at, logit_lens
from catalog.matching import multi_result_matches, score_partitions
from catalog.patching import attribution_patching, exact_patching
from catalog.prompts import PromptTable, build_prompts, sample_pairs
from catalog.tokens import NumberTokens, detect_number_tokens, number_token_ids

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    """Everything shared by all layers of one (model, checkpoint, config) measurement."""

    config: MeasureConfig
    numbers: NumberTokens
    table: PromptTable
    pairs: dict[str, tuple[np.ndarray, np.ndarray]]  # op -> (clean, counterfactual)
    partitions: dict[str, list[Partition]]
    cells: dict[str, Cells]
    number_ids: np.ndarray
    acts: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> (n_prompts, d_mlp)


@dataclass
class Matches:
    """Heuristic scores of one layer: one row per (neuron, operator, heuristic) >= floor."""

    neuron: np.ndarray  # int32
    op: np.ndarray  # int8, index into config.operators
    heuristic: list[Heuristic]  # one per row
    score: np.ndarray  # float32
    bottom: np.ndarray  # bool: the bottom-k score was larger and is the one kept

    def __len__(self) -> int:
        return len(self.neuron)


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
    effect_exact: Float[np.ndarray, "d_mlp op"] | None
    effect_exact_std: Float[np.ndarray, "d_mlp op"] | None
    effect_attr: Float[np.ndarray, "d_mlp op"] | None
    effect_attr_std: Float[np.ndarray, "d_mlp op"] | None
    rank: np.ndarray  # (d_mlp, op) int32, 0 = largest effect in the layer for that operator
    matches: Matches

    @property
    def effect(self) -> np.ndarray:
        """The effect circuits are built from: exact where measured, else attribution."""
        return self.effect_exact if self.effect_exact is not None else self.effect_attr

    def kv(self, op_prompts: np.ndarray) -> np.ndarray:
        """KV map values (d_mlp, n) for the given prompts: K times the answer's lens value."""
        return self.acts[op_prompts].T * self.answer_lens[:, op_prompts]


@dataclass
class Summary:
    """Checkpoint-level results."""

    accuracy: dict[str, float]
    n_correct: dict[str, int]
    n_pairs: dict[str, int]
    circuit_sizes: list[int]
    faithfulness: dict[str, list[tuple[int, float]]]  # op -> [(k, F)]
    heuristic_knockouts: list[dict]
    prompt_knockouts: dict[str, dict]


@dataclass
class CheckpointResult:
    config: MeasureConfig
    numbers: NumberTokens
    table: PromptTable
    layers: dict[int, LayerResult]
    summary: Summary | None
    provenance: dict


def prepare(
    model: HookedTransformer,
    tokenizer,
    config: MeasureConfig,
    layers: list[int] | None = None,
    progress: bool = False,
) -> Prepared:
    """Build prompts, run the grid pass (activations of ``layers`` and correctness), draw pairs."""
    numbers = detect_number_tokens(tokenizer, prepend_bos=model.cfg.default_prepend_bos)
    table = build_prompts(tokenizer, numbers, config)
    layers = check_layers(model, layers)
    acts = run_grid(model, table, layers, batch_size=config.batch_size, progress=progress)
    pairs = {op: sample_pairs(table, op, config.pairs_per_op, config.seed)
             for op in config.operators}
    cells, partitions = {}, {}
    for op in config.operators:
        idx = table.op_index(op)
        cells[op] = Cells(op, table.a[idx], table.b[idx], table.result[idx], table.lo, table.hi)
        partitions[op] = partitions_for(cells[op], config)
    return Prepared(config, numbers, table, pairs, partitions, cells,
                    number_token_ids(tokenizer, min(numbers.limit, 10_000)), acts)


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


def _with_bottom(model: HookedTransformer, config: MeasureConfig) -> bool:
    if config.score_bottom == "always":
        return True
    if config.score_bottom == "never":
        return False
    return bool(model.cfg.gated_mlp)


def _pair_stats(per_pair: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if per_pair.shape[1] == 0:
        nan = np.full(per_pair.shape[0], np.nan, dtype=np.float32)
        return nan, nan
    return per_pair.mean(1), per_pair.std(1)


def measure_layer(model: HookedTransformer, prep: Prepared, layer: int) -> LayerResult:
    """Every measurement of one layer, given the shared preparation."""
    config, table = prep.config, prep.table
    if layer not in prep.acts:
        prep.acts.update(run_grid(model, table, [layer], batch_size=config.batch_size))
    acts = prep.acts[layer]
    d_mlp, n_ops = model.cfg.d_mlp, len(config.operators)
    shape = (d_mlp, n_ops)
    stats = {name: np.zeros(shape, dtype=np.float32) for name in ("max", "mean", "density")}
    eff = {name: np.full(shape, np.nan, dtype=np.float32)
           for name in ("exact", "exact_std", "attr", "attr_std")}
    lens = logit_lens(model, layer, prep.number_ids, k=config.lens_top_k)
    answer_lens = lens_at(model, layer, table.answer)
    with_bottom = _with_bottom(model, config)
    rows: list[tuple] = []
    for o, op in enumerate(config.operators):
        idx = table.op_index(op)
        k_map = acts[idx].T  # (d_mlp, cells)
        stats["max"][:, o] = k_map.max(1)
        stats["mean"][:, o] = k_map.mean(1)
        stats["density"][:, o] = (k_map > 0).mean(1)
        clean, cf = prep.pairs[op]
        if "exact" in config.patching:
            per_pair = exact_patching(model, table, layer, clean, cf, acts[cf],
                                      chunk=config.patch_chunk)
            eff["exact"][:, o], eff["exact_std"][:, o] = _pair_stats(per_pair)
        if "attribution" in config.patching and len(clean):
            per_pair = attribution_patching(model, table, [layer], clean, {layer: acts[cf]},
                                            cf)[layer]
            eff["attr"][:, o], eff["attr_std"][:, o] = _pair_stats(per_pair)
        kv_map = k_map * answer_lens[:, idx]
        dev = model.cfg.device
        m = score_partitions(torch.as_tensor(k_map, device=dev),
                             torch.as_tensor(kv_map, device=dev), prep.partitions[op],
                             config.score_floor, with_bottom, config.pattern_top_k,
                             cells=prep.cells[op])
        rows.extend((int(n), o, m.heuristics[h], float(s), bool(b))
                    for n, h, s, b in zip(m.neuron, m.heuristic, m.score, m.bottom, strict=True))
        if op == "/":
            for n, h, s in multi_result_matches(torch.as_tensor(kv_map), table.result[idx],
                                                top=config.multi_result_top):
                if s >= config.score_floor:
                    rows.append((n, o, h, s, False))
    effect = eff["exact"] if "exact" in config.patching else eff["attr"]
    rank = np.argsort(np.argsort(-np.nan_to_num(effect, nan=-np.inf), axis=0, kind="stable"),
                      axis=0, kind="stable").astype(np.int32)
    matches = Matches(
        neuron=np.array([r[0] for r in rows], dtype=np.int32),
        op=np.array([r[1] for r in rows], dtype=np.int8),
        heuristic=[r[2] for r in rows],
        score=np.array([r[3] for r in rows], dtype=np.float32),
        bottom=np.array([r[4] for r in rows], dtype=bool),
    )
    return LayerResult(
        layer=layer, acts=acts, lens=lens, answer_lens=answer_lens,
        max_act=stats["max"], mean_act=stats["mean"], density=stats["density"],
        effect_exact=eff["exact"] if "exact" in config.patching else None,
        effect_exact_std=eff["exact_std"] if "exact" in config.patching else None,
        effect_attr=eff["attr"] if "attribution" in config.patching else None,
        effect_attr_std=eff["attr_std"] if "attribution" in config.patching else None,
        rank=rank, matches=matches,
    )


def summarize(
    model: HookedTransformer,
    prep: Prepared,
    effects: dict[int, np.ndarray],
    matches: dict[int, Matches],
    run_knockouts: bool = True,
) -> Summary:
    """Checkpoint summary from every layer's effects (d_mlp, op) and matches.

    Circuits span all layers, so faithfulness and knockouts need every layer.
    """
    config, table = prep.config, prep.table
    n_layers, d_mlp = model.cfg.n_layers, model.cfg.d_mlp
    missing = sorted(set(range(n_layers)) - set(effects))
    if missing:
        raise ValueError(f"summarize needs every layer; missing layers {missing}")
    ks = circuits.circuit_sizes(d_mlp, config.circuit_fractions)
    means = circuits.position_means(model, table, config.batch_size)
    rng = np.random.default_rng([config.seed, 7])
    faith, h_knock, p_knock = {}, [], {}
    top_k = circuits.circuit_sizes(d_mlp, (config.top_set_fraction,))[0]
    for o, op in enumerate(config.operators):
        correct = table.op_index(op)[table.correct[table.op_index(op)]]
        prompts = np.sort(rng.choice(correct, min(len(correct), config.faithfulness_prompts),
                                     replace=False)) if len(correct) else correct
        eff = np.stack([np.nan_to_num(effects[layer][:, o], nan=-np.inf)
                        for layer in range(n_layers)])
        faith[op] = circuits.faithfulness_curve(model, table, prompts, eff, ks, means)
        if not run_knockouts or len(prompts) == 0:
            continue
        top_set = circuits.top_k_mask(eff, top_k)
        by_h: dict[str, tuple[Heuristic, np.ndarray]] = {}
        for layer in range(n_layers):
            m = matches[layer]
            sel = (m.op == o) & (m.score >= config.match_threshold)
            for n, i in zip(m.neuron[sel], np.nonzero(sel)[0], strict=True):
                h = m.heuristic[i]
                if h.key not in by_h:
                    by_h[h.key] = (h, np.zeros((n_layers, d_mlp), dtype=bool))
                by_h[h.key][1][layer, n] = True
        ranked = sorted(by_h.values(), key=lambda x: (-int((x[1] & top_set).sum()), x[0].key))
        for h, mask in ranked[:20]:
            row = circuits.heuristic_knockout(model, table, prompts, h, mask & top_set)
            if row["n_neurons"]:
                h_knock.append({"op": op, **row})
        p_knock[op] = circuits.prompt_knockout(
            model, table, prompts, [h for h, _ in ranked], [m for _, m in ranked], top_set,
            config.knockout_neurons, config.seed)
    return Summary(
        accuracy=accuracy_by_operator(table),
        n_correct={op: int(table.correct[table.op_index(op)].sum()) for op in config.operators},
        n_pairs={op: len(prep.pairs[op][0]) for op in config.operators},
        circuit_sizes=ks,
        faithfulness=faith,
        heuristic_knockouts=h_knock,
        prompt_knockouts=p_knock,
    )


def measure(
    model: HookedTransformer,
    tokenizer,
    config: MeasureConfig | None = None,
    layers: list[int] | None = None,
    progress: bool = True,
    summary: bool = True,
    provenance: dict | None = None,
) -> CheckpointResult:
    """Measure every neuron of ``layers`` (default all) and, if all layers, the summary."""
    config = config or MeasureConfig()
    layers = check_layers(model, layers)
    prep = prepare(model, tokenizer, config, layers, progress=progress)
    results = {}
    for layer in tqdm(layers, desc="layers", disable=not progress, unit="layer"):
        results[layer] = measure_layer(model, prep, layer)
    summ = None
    if summary and len(layers) == model.cfg.n_layers:
        summ = summarize(model, prep, {k: v.effect for k, v in results.items()},
                         {k: v.matches for k, v in results.items()})
    prov = {"catalog_version": CATALOG_VERSION, "config_hash": config.config_hash(),
            "numbers": prep.numbers.as_dict(), **(provenance or {})}
    return CheckpointResult(config, prep.numbers, prep.table, results, summ, prov)
