"""The label rule's controls on each layer (``LabelControls``), and the labelled maps they
count (``labelled_maps``, ``result_labelled_maps``: the steps of
``catalog.labels.operator_labels.label_operator``, rows from the label threshold up)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch

from catalog.core.digest import array_digest
from catalog.core.token_format import FORMAT_KINDS, format_maps
from catalog.labels import value_null
from catalog.labels.heuristics import n_tests as count_tests
from catalog.labels.heuristics import partitions_for, rescue_pairs, rescue_partitions
from catalog.labels.matches import Matches
from catalog.labels.operand_fit import OperandFit
from catalog.labels.operator_labels import gated, label_operator, operand_fit

# maps per layer and operator that each control scores
CONTROL_MAPS = 128
# the token-format control's counts kept per process, by everything they are computed
# from (``format_key``): they depend on the config, the operator's cells and the tokenizer,
# not on the checkpoint, and a worker measures the checkpoints of one model one after the
# other (2.6 s of each built-in checkpoint's 36 s of layers on [0, 100), one thread)
FORMAT_KEPT = 256
_FORMAT_COUNTS: OrderedDict[str, dict[str, int]] = OrderedDict()


def format_key(config, op: str, cells, with_bottom: bool, multi_result: int, device,
               maps: np.ndarray) -> str:
    """The digest of what the token-format control's counts on ``maps`` depend on: the
    config (its hash), the operator, its cells (operands and results), the bottom side and
    multi-result family, the device, and the maps themselves (which carry the layer, the
    seed and the tokenizer's token counts)."""
    return array_digest(*(np.asarray(x, dtype=np.int64) for x in (cells.a, cells.b,
                                                                  cells.result)), maps,
                        text=f"{config.config_hash()}|{op}|{with_bottom}|{bool(multi_result)}|"
                             f"{device}", size=20)


def labelled_maps(k_map: torch.Tensor, kv: torch.Tensor, cells, partitions: list, config,
                  n_tests: int, null: value_null.ValueNull | None, with_bottom: bool,
                  fit: OperandFit | None) -> np.ndarray:
    """Indices of the maps the rule labels (the controls count them): the rows from the
    label threshold up, under the same steps as ``label_operator``."""
    return result_labelled_maps(k_map, kv, cells, partitions, config, n_tests, null,
                                with_bottom, fit)[0]


def result_labelled_maps(k_map: torch.Tensor, kv: torch.Tensor, cells, partitions: list,
                         config, n_tests: int, null: value_null.ValueNull | None,
                         with_bottom: bool, fit: OperandFit | None) -> tuple[np.ndarray,
                                                                             np.ndarray]:
    """(maps with any label, maps with a result label), for the controls."""
    def score(k: torch.Tensor, kv_scored: torch.Tensor, orders: dict, rescue) -> Matches:
        parts = rescue_partitions(partitions, rescue) if rescue else partitions
        return value_null.score_for_labels(k, kv_scored, cells, parts, config, n_tests,
                                           null, with_bottom, orders, rescue_pairs(rescue))

    m = label_operator(config, k_map, kv, score, n_tests, null, fit, explain=False).matches
    result = np.array([h.target == "result" for h in m.heuristics] or [False])[m.heuristic]
    return (np.unique(m.neuron[m.implements]),
            np.unique(m.neuron[m.implements & result]))


class LabelControls:
    """Two controls of the label rule on each layer, each on up to ``CONTROL_MAPS`` maps:

    - ``labelled`` of ``n`` of the layer's live maps scored against heuristics whose
      operand and result values are relabelled at random (within the null's strata): how
      often maps of THIS model get labels for values they cannot be about;
    - ``format_labelled`` (any label) and ``format_result`` (a result label) of
      ``format_n`` maps that know only how the numbers are written (a random function of
      each operand's digit count, first digit and token count, added across the operands;
      or of the answer's digit and token counts), on the operator's own cells and
      heuristics: what the rule makes of the token format alone, for every tokenizer.

    The report shows them beside every label share."""

    def __init__(self, config, cells: dict, partitions: dict, n_tests: dict, nulls_: dict,
                 fits: dict, with_bottom: bool, multi_result: dict, tokenizer, device) -> None:
        self.config, self.cells, self.partitions = config, cells, partitions
        self.n_tests, self.nulls, self.fits = n_tests, nulls_, fits
        self.with_bottom, self.multi_result = with_bottom, multi_result
        self.tokenizer, self.device = tokenizer, device
        self._relabelled: dict[str, tuple] = {}  # op -> the relabelled-values setup
        self._tokens_of: dict[int, int] = {}

    def _setup(self, op: str, o: int) -> tuple:
        """One relabelling per operator, for every layer."""
        if op not in self._relabelled:
            config = self.config
            cells = value_null.relabelled(self.cells[op], config.null_strata,
                                     np.random.default_rng([config.seed, o, 1]))
            parts = partitions_for(cells, config)
            m_tests = count_tests(parts, self.with_bottom, self.multi_result[op])
            null = None
            if config.label_rule == "values":
                null = value_null.ValueNull.of(cells, parts, config.null_strata, config.seed,
                                          config.pattern_top_k, m_tests,
                                          config.significance_level)
                m_tests = value_null.n_value_tests(null, parts, self.with_bottom,
                                              config.significance_level)
            fit = operand_fit(config, cells, self.device) if gated(config) else None
            self._relabelled[op] = (cells, parts, null, m_tests, fit)
        return self._relabelled[op]

    def token_count(self, value: int) -> int:
        """How many tokens the tokenizer writes ``value`` with."""
        if value not in self._tokens_of:
            self._tokens_of[value] = len(self.tokenizer.encode(str(value),
                                                               add_special_tokens=False))
        return self._tokens_of[value]

    def measure(self, layer: int, o: int, op: str, k_map: np.ndarray, kv: np.ndarray) -> dict:
        config, dev = self.config, self.device
        gen = np.random.default_rng([config.seed, layer, o, 1])
        pick = np.sort(gen.choice(len(k_map), min(CONTROL_MAPS, len(k_map)), replace=False))
        cells, parts, null, m_tests, fit = self._setup(op, o)
        hits = labelled_maps(torch.as_tensor(k_map[pick], device=dev),
                             torch.as_tensor(kv[pick], device=dev), cells, parts, config,
                             m_tests, null, self.with_bottom, fit)
        out = {"labelled": int(len(hits)), "n": int(len(pick))}
        own = self.cells[op]
        fmt_gen = np.random.default_rng([config.seed, layer, o, 2])
        per_kind = max(1, len(pick) // len(FORMAT_KINDS))
        maps = np.concatenate([
            format_maps(kind, own.a, own.b, own.result, per_kind, fmt_gen, self.token_count)
            for kind in FORMAT_KINDS])
        key = format_key(config, op, own, self.with_bottom, self.multi_result[op], dev, maps)
        if key in _FORMAT_COUNTS:  # another checkpoint of this process counted these maps
            _FORMAT_COUNTS.move_to_end(key)
        else:
            maps_t = torch.as_tensor(maps, device=dev)
            any_label, result_label = result_labelled_maps(
                maps_t, maps_t, own, self.partitions[op], config, self.n_tests[op],
                self.nulls.get(op), self.with_bottom, self.fits.get(op))
            _FORMAT_COUNTS[key] = dict(format_labelled=int(len(any_label)),
                                       format_result=int(len(result_label)),
                                       format_n=int(len(maps)))
            while len(_FORMAT_COUNTS) > FORMAT_KEPT:
                _FORMAT_COUNTS.popitem(last=False)
        out.update(_FORMAT_COUNTS[key])
        return out
