"""The checkpoint level of a run: component effects, faithfulness curves, knockouts and
label enrichment over the measured layers (``CheckpointRun.summarize``).

``CheckpointSummary`` is the half of ``catalog.run.checkpoint.CheckpointRun`` that works on every
layer's digest at once; it needs the run's prepared prompts, pairs and heuristics and
nothing of any one layer's activations.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
from transformer_lens import HookedTransformer

from catalog.circuits import knockouts, paper
from catalog.circuits.final import KINDS as FINAL_KINDS
from catalog.circuits.final import FinalCircuit
from catalog.config import ExecutionConfig, ScienceConfig
from catalog.core.stats import nan_mean
from catalog.explain.grid import explain_prompts, summarize_prompts
from catalog.explain.holds import Means, labels_of, typical_of
from catalog.labels import enrichment
from catalog.labels.heuristics import Heuristic, Partition
from catalog.labels.matches import Matches
from catalog.measuring import ablation
from catalog.measuring import effects as effects_mod
from catalog.measuring.components import ComponentEffects, component_effects, residual_lens
from catalog.measuring.grids import PrefixRunner, accuracy_by_operator
from catalog.measuring.prompts import PromptTable
from catalog.run.results import LayerDigest, Summary


def _headline(curves: list, protocol: str) -> dict:
    """The summary's circuit sizes and per-operator faithfulness points, from the curves of
    the config's first protocol."""
    first = [c for c in curves if c.protocol == protocol]
    return {"circuit_sizes": sorted({k for c in first for k, _ in c.curve()}),
            "faithfulness": {c.op: _points(c, "ratio_of_means") for c in first},
            "faithfulness_mean_ratio": {c.op: _points(c, "mean_ratio") for c in first}}


def _points(curve, stat: str) -> list[tuple]:
    """(size, faithfulness) of a curve under ``stat``, NaN where undefined."""
    return [(k, v if v is not None else float("nan")) for k, v in curve.curve(stat=stat)]


class CheckpointSummary:
    """The summary methods of ``CheckpointRun`` (which sets every attribute below)."""

    model: HookedTransformer
    tokenizer: object
    config: ScienceConfig
    execution: ExecutionConfig
    d_mlp: int
    table: PromptTable
    pairs: dict[str, tuple[np.ndarray, np.ndarray]]
    partitions: dict[str, list[Partition]]

    def _require_prepared(self) -> None:
        raise NotImplementedError

    def summarize_digests(self, digests: dict[int, LayerDigest], run_knockouts: bool = True,
                          final: FinalCircuit | None = None) -> Summary:
        """``summarize`` from each layer's ``LayerDigest``."""
        return self.summarize({k: d.effect for k, d in digests.items()},
                              {k: d.matches for k, d in digests.items()},
                              run_knockouts=run_knockouts,
                              attribution={k: d.attribution for k, d in digests.items()},
                              final=final, means={k: (d.mean_act, d.mean_kv)
                                                  for k, d in digests.items()})

    def summarize(self, effects: dict[int, np.ndarray], matches: dict[int, Matches],
                  run_knockouts: bool = True,
                  attribution: dict[int, np.ndarray | None] | None = None,
                  final: FinalCircuit | None = None,
                  means: dict[int, tuple] | None = None) -> Summary:
        """Checkpoint summary from the measured layers' rank keys (d_mlp, op; largest
        first, ``LayerResult.effect``), their attribution scores (``LayerResult.
        attribution_score``, what a paper circuit ranks by) and labelled matches;
        ``means``: layer -> (mean_act, mean_kv), what labels' sides are checked against.

        Component effects per operator, then each of the config's faithfulness protocols'
        curves (docs/method.md section 6), then the knockouts. Circuits span the layers
        given: the others are never pruned, and the summary records which layers it
        covers and, per protocol, which it pruned and which it kept whole.
        """
        self._require_prepared()
        model, config = self.model, self.config
        n_layers, d_mlp = model.cfg.n_layers, self.d_mlp
        layers = sorted(effects)
        if not layers:
            raise ValueError("summarize needs at least one measured layer")
        runner = PrefixRunner(model, self.table)  # one prefix and context cache for the summary
        draws = self._faithfulness_draws()
        seconds: dict[str, float] = {}
        t = time.perf_counter()
        comps, lens = self._components_and_lens(draws, runner)
        seconds["component effects and residual lens"] = time.perf_counter() - t
        if final is not None:
            final.check(n_layers, model.cfg.n_heads, d_mlp)
        curves, final_curves = self._curves(effects, attribution or {}, comps, draws, layers,
                                            seconds, final)
        h_knock, p_knock, explained = self._knocked_and_explained(
            effects, matches, means or {}, draws, layers, runner, seconds, run_knockouts)
        return Summary(
            **self._counts(matches), layers=layers,
            **_headline(curves, config.faithfulness_protocols[0]),
            heuristic_knockouts=h_knock, prompt_knockouts=p_knock,
            components=comps, curves=curves, residual_lens=lens,
            enrichment=self._enrichment(effects, matches, layers),
            prompt_explanations=explained, seconds=seconds,
            final_curves=final_curves, final_step=final.step if final is not None else None,
        )

    def _knocked_and_explained(self, effects: dict, matches: dict, means: dict,
                               draws: dict, layers: list[int], runner: PrefixRunner,
                               seconds: dict[str, float], run_knockouts: bool) -> tuple:
        """(the heuristic knockouts, the prompt knockouts, the prompts' explanations), each
        timed into ``seconds``; empty where ``run_knockouts`` is False."""
        t = time.perf_counter()
        h_knock, p_knock, top_sets = (self._knockouts(effects, matches, draws, layers, runner)
                                      if run_knockouts else ([], {}, {}))
        seconds["knockouts"] = time.perf_counter() - t
        t = time.perf_counter()
        explained = self._explained(matches, means, draws, layers, top_sets, runner) \
            if run_knockouts else {}
        seconds["prompt explanations"] = time.perf_counter() - t
        return h_knock, p_knock, explained

    def _components_and_lens(self, draws: dict[str, list[np.ndarray]],
                             runner: PrefixRunner) -> tuple[dict, dict]:
        """Each operator's component effects (where the config asks) and the residual
        stream's lens on its first faithfulness draw."""
        model, config, table = self.model, self.config, self.table
        comps = {op: component_effects(model, table, *self.pairs[op], config.component_positions,
                                       config.rank_statistic, runner, self._exact_heads())
                 for op in config.operators} if config.component_positions else {}
        lens = {op: residual_lens(model, table, draws[op][0] if draws[op] else
                                  np.zeros(0, np.int64), runner) for op in config.operators}
        return comps, lens

    def _knockouts(self, effects: dict[int, np.ndarray], matches: dict[int, Matches],
                   draws: dict[str, list[np.ndarray]], layers: list[int],
                   runner: PrefixRunner) -> tuple[list, dict, dict]:
        """(heuristic knockouts, prompt knockouts, each operator's top set) over the
        faithfulness prompts: the top set is the measured layers' neurons of largest
        effect (``top_set_fraction``); each of its 20 leading heuristics knocked out."""
        model, config, table = self.model, self.config, self.table
        n_layers, d_mlp = model.cfg.n_layers, self.d_mlp
        measured = np.zeros(n_layers, dtype=bool)
        measured[layers] = True
        h_knock, p_knock, top_sets = [], {}, {}
        top_k = paper.circuit_sizes(d_mlp, (config.top_set_fraction,))[0]
        for o, op in enumerate(config.operators):
            if not draws[op]:
                continue
            prompts = np.unique(np.concatenate(draws[op]))
            if len(prompts) == 0:
                continue
            eff = np.full((n_layers, d_mlp), -np.inf)
            for layer in layers:
                eff[layer] = np.nan_to_num(effects[layer][:, o], nan=-np.inf)
            top_set = paper.top_k_mask(eff, top_k) & measured[:, None]
            top_sets[op] = top_set
            ranked = self._heuristic_masks(o, matches, top_set)
            for h, mask in ranked[:20]:
                row = knockouts.heuristic_knockout(model, table, prompts, h, mask & top_set,
                                                   runner)
                if row["n_neurons"]:
                    h_knock.append({"op": op, **row})
            p_knock[op] = knockouts.prompt_knockout(
                model, table, prompts, [h for h, _ in ranked], [m for _, m in ranked], top_set,
                config.knockout_neurons, config.seed, runner)
        return h_knock, p_knock, top_sets

    def _counts(self, matches: dict[int, Matches]) -> dict:
        """The summary's per-operator counts: accuracy, correct prompts, pairs, labelled
        neurons, solved examples' cells left out; and the heuristics' aliases."""
        config, table = self.config, self.table
        correct_all = table.correct
        assert correct_all is not None and table.is_shot is not None
        ops = config.operators
        return dict(
            accuracy=accuracy_by_operator(table),
            n_correct={op: int(correct_all[table.op_index(op)].sum()) for op in ops},
            n_pairs={op: len(self.pairs[op][0]) for op in ops},
            n_heuristic_neurons={op: sum(len(m.neurons_matching(o)) for m in matches.values())
                                 for o, op in enumerate(ops)},
            n_excluded={op: int((correct_all & table.is_shot)[table.op_index(op)].sum())
                        for op in ops},
            aliases={op: {h.key: list(h.aliases) for p in self.partitions[op]
                          for h in p.heuristics if h.aliases} for op in ops})

    def _enrichment(self, effects: dict[int, np.ndarray], matches: dict[int, Matches],
                    layers: list[int]) -> list[dict]:
        """Labels among the top set against random neurons (``enrichment.enrichment``)."""
        config, d_mlp = self.config, self.d_mlp
        return enrichment.enrichment(
            {layer: effects_mod.ranks(np.nan_to_num(effects[layer], nan=-np.inf))
             for layer in layers},
            {layer: enrichment.label_masks(matches[layer], d_mlp, len(config.operators))
             for layer in layers if layer in matches},
            config.operators, config.top_set_fraction, config.seed)

    def _explained(self, matches: dict[int, Matches], means: dict[int, tuple],
                   draws: dict[str, list[np.ndarray]],
                   layers: list[int], top_sets: dict[str, np.ndarray],
                   runner: PrefixRunner) -> dict[str, dict]:
        """op -> each knockout prompt's answer decomposed over the labelled neurons of the
        measured layers, with what the labels add against their controls and against the
        labels placed at random, aggregated (catalog.explain.grid); the knockouts zero
        at the last position through the summary's runner."""
        table, out = self.table, {}
        for o, op in enumerate(self.config.operators):
            prompts = np.unique(np.concatenate(draws[op])) if draws[op] else np.zeros(0, int)
            if not len(prompts):
                continue
            typical, typical_kv = typical_of(
                {layer: Means(*m) for layer, m in means.items()}, o)

            # many edits of these prompts per forward, against the runner's one cached
            # context of them; a request's rows (a steered set's prompts) run alone
            evaluate = knockouts.PromptEvaluator(self.model, table, prompts, runner)
            terms = explain_prompts(self.model, self.tokenizer, self.config, op,
                                    table.a[prompts], table.b[prompts], labels_of(matches, o),
                                    typical=typical, typical_kv=typical_kv, evaluate=evaluate,
                                    top_set=top_sets.get(op))
            out[op] = summarize_prompts(terms, layers)
        return out

    def _exact_heads(self) -> int | None:
        """How many heads component effects patch exactly (None: every head)."""
        setting = self.config.component_exact_heads
        if setting == "all":
            return None
        if setting == "auto":
            cfg = self.model.cfg
            return 2 * paper.heads_to_keep(cfg.n_layers, cfg.n_heads, self.config.heads_kept)
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
                layers: list[int], seconds: dict[str, float], final: FinalCircuit | None = None,
                ) -> tuple[list[paper.CurveResult], list[paper.CurveResult]]:
        """Every protocol's faithfulness curve for every operator, and ``final``'s curves
        (protocol ``final``: its ranked circuit and random control, under the paper
        protocol's means); the wall time of each protocol's (its means included) is added to
        ``seconds``."""
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
            mlp_last = nan_mean(np.stack([c.mlp_last(config.rank_sign)
                                         for c in comps.values()]), axis=0)
        out: list[paper.CurveResult] = []
        finals: list[paper.CurveResult] = []
        for o, op in enumerate(config.operators):
            setup = self._setup(op, draws, cf_of)
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
                plan = paper.plan(protocol, model, layers, score, key, comps.get(op),
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
                out.append(paper.measure_curve(model, setup, op, plan, replace, context,
                                                  population, ranking))
                name = f"curve, {protocol}"
                seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t
            if final is not None and op in final.plans:
                t = time.perf_counter()
                finals.append(self._final_curve(op, setup, final, mean_replace(
                    config.mean_population, config.ablate_context, config.mean_prompts)))
                seconds["curve, final circuit"] = (seconds.get("curve, final circuit", 0.0)
                                                   + time.perf_counter() - t)
        return out, finals

    def _setup(self, op: str, draws: dict[str, list[np.ndarray]],
               cf_of: dict[int, int]) -> paper.CurveSetup:
        config = self.config
        return paper.CurveSetup(
            table=self.table, width=self.d_mlp, fractions=tuple(config.circuit_fractions),
            counts=config.counts(self.d_mlp), seeds=draws[op], cf_of=cf_of, seed=config.seed,
            batch_size=self.execution.batch_size)

    def _final_curve(self, op: str, setup: paper.CurveSetup, final: FinalCircuit,
                     replace: ablation.Replace) -> paper.CurveResult:
        config = self.config
        got = paper.measure_curve(self.model, setup, op, final.plans[op], replace,
                                  config.ablate_context, config.mean_population, "final",
                                  FINAL_KINDS)
        got.protocol = "final"
        return got

    def final_curves(self, final: FinalCircuit) -> list[paper.CurveResult]:
        """Only ``final``'s curves at this checkpoint (catalog.circuits.final): what
        ``summarize(..., final=final)`` measures of it, for a checkpoint whose summary was
        written before the final checkpoint was catalogued. Same prompt draws, the same
        counterfactuals and the same means as the summary's, so equal to its curves."""
        self._require_prepared()
        model, config = self.model, self.config
        final.check(model.cfg.n_layers, model.cfg.n_heads, self.d_mlp)
        draws = self._faithfulness_draws()
        cf_of = self._counterfactuals(np.concatenate(
            [np.concatenate(d) for d in draws.values() if d] or [np.zeros(0, np.int64)]))
        pop = ablation.mean_population(self.tokenizer, self.table, config,
                                       config.mean_population, config.mean_prompts, config.seed)
        replace = ablation.mean_replacement(ablation.position_means(
            model, pop, config.ablate_context, self.execution.batch_size))
        return [self._final_curve(op, self._setup(op, draws, cf_of), final, replace)
                for op in config.operators if op in final.plans]

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
