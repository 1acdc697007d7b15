"""What a catalog request will cost, before it is queued: ``ncat plan``.

A short measured run of the model (``jobs.calibration``, cached) scaled by the work the
request counts, per phase (``jobs.costs``); docs/planning.md explains the method, its
units and how close it came to measured runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from catalog.config import ExecutionConfig, ScienceConfig
from catalog.measuring.memory import MemoryEstimate
from jobs.calibration import (
    cached_calibration,
    cached_grid_costs,
    calibrate,
    cost_key,
    store_calibration,
)
from jobs.costs import (
    Calibration,
    GridCosts,
    exact_units,
    expected_correct,
    grid_cells,
    pairs_per_op,
    sketch_codes,
    summary_units,
)


@dataclass
class Phase:
    name: str
    units: float
    unit: str
    seconds: float


@dataclass
class Plan:
    model: str
    device: str
    checkpoints: int
    layers: int
    d_mlp: int
    prompts: int
    phases: list[Phase]
    storage: dict[str, float]  # bytes per checkpoint, by table
    calibration: Calibration
    notes: list[str] = field(default_factory=list)
    memory: MemoryEstimate | None = None  # peak memory, estimated before loading

    @property
    def seconds_per_checkpoint(self) -> float:
        return sum(p.seconds for p in self.phases)

    @property
    def bytes_per_checkpoint(self) -> float:
        return sum(self.storage.values())

    def as_dict(self) -> dict:
        """The estimate as ``--json`` prints it: every field, and the totals (seconds and
        bytes per checkpoint and over every checkpoint)."""
        from dataclasses import asdict

        return {**asdict(self), "seconds_per_checkpoint": self.seconds_per_checkpoint,
                "bytes_per_checkpoint": self.bytes_per_checkpoint,
                "seconds": self.seconds_per_checkpoint * self.checkpoints,
                "bytes": self.bytes_per_checkpoint * self.checkpoints}

    def render(self) -> str:
        """The estimate as a table for the terminal."""
        lines = [f"Estimate for {self.model} on {self.device}:",
                 f"{self.checkpoints} checkpoint(s) x {self.layers} layer(s) x {self.d_mlp} "
                 f"neurons, {self.prompts:,} prompts per checkpoint",
                 "", f"{'phase':<16}{'work per checkpoint':>34}{'time':>12}"]
        for p in self.phases:
            lines.append(f"{p.name:<16}{f'{p.units:,.0f} {p.unit}':>34}"
                         f"{_duration(p.seconds):>12}")
        lines.append(f"{'per checkpoint':<16}{'':>34}{_duration(self.seconds_per_checkpoint):>12}")
        lines += ["", f"{'table':<16}{'per checkpoint':>16}{'all checkpoints':>18}"]
        for table, b in self.storage.items():
            lines.append(f"{table:<16}{_size(b):>16}{_size(b * self.checkpoints):>18}")
        lines.append(f"{'total':<16}{_size(self.bytes_per_checkpoint):>16}"
                     f"{_size(self.bytes_per_checkpoint * self.checkpoints):>18}")
        if self.memory is not None:
            lines += ["", self.memory.render()]
        lines += ["", f"Total: {_duration(self.seconds_per_checkpoint * self.checkpoints)} "
                      f"of one worker, {_size(self.bytes_per_checkpoint * self.checkpoints)}."]
        c = self.calibration
        lines.append(f"Calibrated {c.measured_at} on {c.device} in {c.calibration_s:.0f} s "
                     "(cached; --recalibrate measures again).")
        lines += self.notes
        return "\n".join(lines)


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def _size(b: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if b < 1000 or unit == "TB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1000
    return f"{b:.1f} TB"


FINAL_KINDS_SHARE = 2 / 3  # ranked + random of ranked, reversed, random


def estimate(cal: Calibration, config: ScienceConfig, *, n_checkpoints: int,
             layers: list[int] | None, limit: int | None, costs: GridCosts,
             execution: ExecutionConfig | None = None) -> Plan:
    """Scale a calibration to a request (``limit``: the single-token limit, None for a
    digit-level tokenizer)."""
    execution = execution or ExecutionConfig(device=cal.device)
    todo = list(range(cal.n_layers)) if layers is None else sorted(set(layers))
    n_layers, d_mlp = len(todo), cal.d_mlp
    valid = grid_cells(config, limit)
    cells = {op: int(v.sum()) for op, v in valid.items()}
    prompts = sum(cells.values())
    ops = len(config.operators)
    fits = prompts * n_layers * d_mlp * 4 <= execution.activation_budget
    passes = 1 if fits else 1 + n_layers
    phases = [Phase("grid pass", prompts * passes, "prompts",
                    passes * _seconds(cal, "grid", prompts)),
              Phase("heuristics", ops, "operators", costs.heuristics_s),
              Phase("lens", n_layers, "layers", _seconds(cal, "lens", n_layers))]
    correct = expected_correct(cal, cells)  # pairs and faithfulness prompts come from these
    pairs = sum(pairs_per_op(config, correct).values())
    phases += _patching_phases(cal, config, pairs, todo)
    live_share = [cal.live_by_layer[layer] for layer in todo]
    live = sum(live_share) * d_mlp  # live neurons x layers (averaged over operators)
    phases += _label_phases(cal, config, costs, live, n_layers,
                            2.0 if execution.k_explanations else 1.0)
    phases += _summary_phases(cal, config, correct, prompts, pairs, n_checkpoints)
    storage = _storage(cal, config, valid, live_share, live, n_layers)
    total = sum(storage.values())
    phases.append(Phase("writing", total, "bytes", _seconds(cal, "write", total)))
    return Plan(model=cal.model, device=cal.device, checkpoints=n_checkpoints,
                layers=n_layers, d_mlp=d_mlp, prompts=prompts, phases=phases,
                storage=storage, calibration=cal,
                notes=_notes(cal, config, correct, pairs, fits, execution))


def _seconds(cal: Calibration, phase: str, units: float) -> float:
    """A phase's time for ``units`` of work: its calibrated fixed cost and cost per unit."""
    fixed, per = cal.seconds.get(phase, (0.0, 0.0))
    return fixed + per * units if units else 0.0


def _patching_phases(cal: Calibration, config: ScienceConfig, pairs: float,
                     todo: list[int]) -> list[Phase]:
    out = []
    if "attribution" in config.patching:
        out.append(Phase("attribution", pairs, "pairs x ops",
                         _seconds(cal, "attribution", pairs)))
    if "exact" in config.patching:
        top = config.exact_top()
        per_layer = cal.d_mlp if top is None else min(top, cal.d_mlp)
        units = exact_units(cal, per_layer * pairs, todo)
        out.append(Phase("exact patching", units, "G multiply-adds" if cal.unembed_macs
                         else "neurons x pairs x ops", _seconds(cal, "exact", units)))
    return out


def _label_phases(cal: Calibration, config: ScienceConfig, costs: GridCosts, live: float,
                  n_layers: int, explained_maps: float = 1.0) -> list[Phase]:
    """Matching, then the label rule's null, gate and second pass; the stored explanations
    (held-out fits of the labelled maps: the KV maps, and where asked the K maps too,
    ``explained_maps`` 2, as long again); the periodic spectra: each over the same maps,
    scaled like matching."""
    ops = len(config.operators)
    random_s = live * sum(costs.per_neuron.values()) + n_layers * sum(costs.per_call.values())
    out = [Phase("matching", live * ops, "live neurons x ops",
                 cal.matching_ratio * random_s)]
    for name, ratio, asked in (("labels (null)", cal.significance_ratio, True),
                               ("explanations", cal.explanations_ratio * explained_maps,
                                True),
                               ("spectra", cal.spectra_ratio, config.spectra)):
        if asked and ratio:
            out.append(Phase(name, live * ops, "live neurons x ops", ratio * random_s))
    return out


def _summary_phases(cal: Calibration, config: ScienceConfig, correct, prompts: int,
                    pairs: float, n_checkpoints: int) -> list[Phase]:
    """The component effects (where asked), the summary, and the final checkpoint's
    circuit at every other checkpoint."""
    out = []
    if config.component_positions:  # every head and MLP layer patched per pair
        out.append(Phase("component effects", pairs, "pairs x ops",
                         _seconds(cal, "components", pairs)))
    units = summary_units(config, correct)  # every run ends with one
    means = sum(config.mean_population_size(kind, cap, prompts)
                for kind, _, cap in config.mean_passes())
    out.append(Phase("summary", units, "prompts x seeds x ops x protocols",
                     _seconds(cal, "summary", units) + _seconds(cal, "means", means)))
    if n_checkpoints > 1 and "paper" in config.faithfulness_protocols:
        # the final checkpoint's circuit at every other checkpoint (catalog.circuits.final):
        # its ranked curve and random control, two of a paper curve's three circuit kinds;
        # averaged over the checkpoints, the last of which measures none
        units = (summary_units(config, correct) / len(config.faithfulness_protocols)
                 * FINAL_KINDS_SHARE * (n_checkpoints - 1) / n_checkpoints)
        out.append(Phase("final circuit", units, "prompts x seeds x ops",
                         cal.seconds.get("summary", (0.0, 0.0))[1] * units))
    return out


def _storage(cal: Calibration, config: ScienceConfig, valid: dict, live_share: list[float],
             live: float, n_layers: int) -> dict[str, float]:
    """Bytes per table: grids full (where asked) or sketched (constant ones cost a row)."""
    b, d_mlp, ops = cal.bytes, cal.d_mlp, len(config.operators)
    top = config.full_grid_top()
    side = config.operand_hi - config.operand_lo
    grid = 0.0
    for share in live_share:  # constant grids cost only their row
        n_live = share * d_mlp
        for op in config.operators:
            n_full = n_live if top is None or side <= 32 else min(top, n_live)
            grid += (n_full * int(valid[op].sum()) * b["grid_full_cell"]
                     + (n_live - n_full) * sketch_codes(config, valid[op])
                     * b["grid_sketch_code"] + d_mlp * b["grid_row"])
    return {
        "neuron_op": b["neuron_op"] * d_mlp * ops * n_layers,
        "neuron_grid": grid,
        "neuron_lens": b["neuron_lens"] * d_mlp * n_layers,
        "neuron_score": b["neuron_score"] * cal.rows_per_neuron_op * live * ops,
    }


def _notes(cal: Calibration, config: ScienceConfig, correct, pairs: float, fits: bool,
           execution: ExecutionConfig) -> list[str]:
    """What the reader of the plan should know: few correct answers, activations that
    do not fit the budget."""
    ops = len(config.operators)
    notes = []
    if correct is not None and pairs < config.pairs_per_op * ops:
        shares = ", ".join(f"{op} {cal.correct_share.get(op, 0.0):.1%}" for op in config.operators)
        notes.append(f"The model answers few prompts correctly on the calibration grid "
                     f"({shares}): about {pairs:,.0f} counterfactual pairs in all, not "
                     f"{config.pairs_per_op * ops:,}; patching and the summary are costed "
                     "for those.")
    if not fits:
        notes.append(f"The activations do not fit NCAT_ACTIVATION_BUDGET "
                     f"({execution.activation_budget:,} bytes): one grid pass per layer.")
    return notes


def plan_request(url: str, model: str, checkpoints, config: ScienceConfig,
                 layers: list[int] | None = None, execution: ExecutionConfig | None = None,
                 recalibrate: bool = False, home: Path | None = None,
                 progress=None, calibrate_if_missing: bool = True) -> Plan | None:
    """The estimate of a request (validated as ``ncat enqueue`` validates it). Calibrates
    on the first checkpoint when no cached calibration fits (or ``recalibrate``); with
    ``calibrate_if_missing`` False returns None instead."""
    from catalog.config.settings import get_settings
    from catalog.measuring.memory import fit_request
    from catalog.sources import load_model
    from jobs.enqueue import validate_request

    execution = execution or ExecutionConfig()
    planned = validate_request(model, checkpoints, config, layers)
    name = planned[0].model
    home = home or get_settings().ncat_home
    key = cost_key(name, execution.device, config)
    # the request must fit before anything is loaded (the calibration loads the model)
    fitted = fit_request(planned[0].shape, config, execution, len(planned[0].layers),
                         f"{name} with this request")
    execution, memory = fitted.execution, fitted.estimate
    cal = None if recalibrate else cached_calibration(home, key)
    if cal is None:
        if not calibrate_if_missing:
            return None
        settings = get_settings()
        # progress None (--quiet): no loader bars either
        lm = load_model(name, planned[0].step, device=execution.device,
                        dtype=config.torch_dtype(), cache_root=settings.builtin_root,
                        progress=progress is not None)
        cal = calibrate(url, lm, config, execution, progress)
        store_calibration(home, key, cal)
    numbers = planned[0].shape.numbers
    limit = None if numbers.digit_level else numbers.limit
    with_bottom = config.scores_bottom(cal.gated)
    costs = cached_grid_costs(home, config, limit, execution.device, with_bottom,
                              again=recalibrate)
    plan = estimate(cal, config, n_checkpoints=len(planned), layers=layers, limit=limit,
                    costs=costs, execution=execution)
    plan.memory = memory
    if fitted.note:
        plan.notes.append(fitted.note)
    return plan


def estimate_in_child(url: str, model: str, checkpoints, config: ScienceConfig, device: str,
                      timeout: float = 3600.0) -> str:
    """``plan_request`` (calibrating if it must) in a child process; returns the rendered
    estimate. For a long-lived caller (the explorer): the model the calibration loads and
    its scratch catalogs live and die with the child. Raises ValueError with the request's
    own error, RuntimeError if the child failed otherwise."""
    import json
    import subprocess
    import sys

    request = json.dumps({"url": url, "model": model, "checkpoints": checkpoints,
                          "config": config.as_dict(), "device": device})
    done = subprocess.run([sys.executable, "-m", "jobs.plan", request], capture_output=True,
                          text=True, timeout=timeout)
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else {}
    except ValueError:
        answer = {}
    if "error" in answer:
        raise ValueError(answer["error"])
    if done.returncode != 0 or "plan" not in answer:
        raise RuntimeError(f"the estimate failed (exit {done.returncode}): "
                           f"{done.stderr.strip()[-2000:]}")
    return answer["plan"]


def _child(argv: list[str]) -> int:
    """``python -m jobs.plan REQUEST``: the child of ``estimate_in_child``; the last line of
    its output is JSON, {"plan": text} or {"error": message}."""
    import json

    from jobs.enqueue import EnqueueError
    from jobs.signals import sigterm_exits

    request = json.loads(argv[0])
    try:
        with sigterm_exits():  # a stopped child still drops its scratch databases
            plan = plan_request(request["url"], request["model"], request["checkpoints"],
                                ScienceConfig.from_dict(request["config"]),
                                execution=ExecutionConfig(device=request["device"]))
    except (EnqueueError, ValueError) as exc:
        print(json.dumps({"error": str(exc)}))
        return 0
    assert plan is not None  # calibrate_if_missing is on
    print(json.dumps({"plan": plan.render()}))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_child(sys.argv[1:]))
