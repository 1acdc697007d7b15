"""Jobs: queue a model and checkpoints (validated by jobs/), and watch progress.

The form's measurement fields are generated from the config dataclasses (the fields
marked ``form``), so their defaults and help texts are the library's and the CLI's.
"""

from __future__ import annotations

import streamlit as st

from catalog.config import ExecutionConfig, ScienceConfig
from catalog.config.flags import FieldSpec, specs
from ui import data
from ui.views.common import reachable
from ui.views.overview import jobs_panel

LABELS = {"operators": "Operators", "operand_lo": "Operands from", "operand_hi": "to (exclusive)",
          "pairs_per_op": "Pairs per operator", "seed": "Seed",
          "heuristic_variant": "Heuristic variant", "device": "Device",
          "template": "Template", "shots": "Solved examples (shots)",
          "patching": "Patching (exact, attribution or both)",
          "exact": "Exact patching of (all, none, top:N)", "label_rule": "Label rule"}


def _input(spec: FieldSpec, column, default):
    label = LABELS.get(spec.name, spec.name.replace("_", " ").capitalize())
    key = f"job-{spec.name}"
    if spec.kind == "operators":
        return tuple(column.multiselect(label, ["+", "-", "*", "/"], default=list(default),
                                        help=spec.help, key=key))
    if spec.choices:
        return column.selectbox(label, spec.choices, index=spec.choices.index(default),
                                help=spec.help, key=key)
    if spec.kind == "int":
        return int(column.number_input(label, min_value=0, value=default, help=spec.help,
                                       key=key))
    text = column.text_input(label, value=spec.show(default), help=spec.help, key=key)
    # typed fields (methods, lists) are parsed as the command line parses them; a bad
    # value is shown as the form's error when it is submitted
    return text if spec.kind == "str" else _Typed(spec, text)


class _Typed:
    """A form value that still has to be parsed (its error is reported on submit)."""

    def __init__(self, spec: FieldSpec, text: str) -> None:
        self.spec, self.text = spec, text

    def value(self):
        return self.spec.parse(self.text)


def render() -> None:
    st.title("Jobs")
    if not reachable():
        return
    science = [s for s in specs(ScienceConfig) if s.form]
    execution = [s for s in specs(ExecutionConfig) if s.form]
    base, recent = ScienceConfig(), data.recent_config()
    if recent is not None:
        try:
            base = ScienceConfig.from_dict(recent[1])
        except (TypeError, ValueError):  # a config this version cannot read: the defaults
            recent = None
    st.caption(f"The form starts from the measurement config of the catalog's most recent "
               f"job (config #{recent[0]}): queueing a checkpoint measured with it finds it "
               "done." if recent else "The form starts from the library's defaults.")
    with st.form("enqueue"):
        model = st.text_input("Model", value="builtin",
                              help="'builtin', a known model fetched with `ncat fetch` (e.g. "
                                   "qwen2.5-coder-0.5b), a hub name, a local directory or a "
                                   ".gguf file")
        checkpoints = st.text_input("Checkpoints", value="all",
                                    help="'all', a list like 0,512,3000, or start:stop:step")
        columns = st.columns(3)
        values = {s.name: _input(s, columns[i % 3], getattr(base, s.name))
                  for i, s in enumerate(science)}
        device = {s.name: _input(s, st, s.default) for s in execution}["device"]
        force = st.checkbox("Recompute jobs that exist (force)")
        left, right = st.columns(2)
        submitted = left.form_submit_button("Queue")
        estimate = right.form_submit_button(
            "Estimate cost", help="time per phase and storage per table before queueing "
                                  "(the first estimate for a model and device calibrates it: "
                                  "two short runs, cached)")
    if estimate:
        show_estimate(model, checkpoints, values, device, base)
    if submitted:
        show_estimate(model, checkpoints, values, device, base, calibrate=False)
        queue(model, checkpoints, values, device, force, base)
    st.subheader("Progress")
    jobs_panel()


def _config(values: dict, base: ScienceConfig) -> ScienceConfig:
    """The form's values over ``base`` (the config the form started from: the fields the
    form does not show keep its values, so an unchanged form asks for that config)."""
    from dataclasses import replace

    return replace(base, **{k: v.value() if isinstance(v, _Typed) else v
                            for k, v in values.items()})


def show_estimate(model: str, checkpoints: str, values: dict, device: str,
                  base: ScienceConfig, calibrate: bool = True) -> None:
    """The request's cost (jobs.plan), as ``ncat plan`` prints it. With ``calibrate`` it is
    computed in a child process (a first estimate for a model and device loads the model
    and runs two scratch catalogs: none of that stays in the explorer); without, only a
    cached calibration is used (queueing never loads the model)."""
    from jobs.enqueue import EnqueueError
    from jobs.plan import estimate_in_child, plan_request

    device = device.strip() or "cpu"
    try:
        if calibrate:
            with st.spinner("Estimating (a first estimate for this model and device "
                            "calibrates it: two short runs)..."):
                text = estimate_in_child(data.database_url(), model.strip(),
                                         checkpoints.strip() or None, _config(values, base), device)
        else:
            p = plan_request(data.database_url(), model.strip(), checkpoints.strip() or None,
                             _config(values, base), execution=ExecutionConfig(device=device),
                             calibrate_if_missing=False)
            if p is None:
                st.caption("No cost estimate yet for this model and device: use Estimate "
                           "cost.")
                return
            text = p.render()
    except (EnqueueError, ValueError) as exc:
        if calibrate:  # on Queue, the request's own errors are shown by queue()
            st.error(str(exc))
        return
    except RuntimeError as exc:
        st.error(str(exc))
        return
    st.markdown("**Cost estimate**")
    st.code(text, language=None)


def queue(model: str, checkpoints: str, values: dict, device: str, force: bool,
          base: ScienceConfig) -> None:
    from jobs.enqueue import EnqueueError, QueuedWithoutBroker, enqueue

    try:
        config = _config(values, base)
        if config.precision_caveat():
            st.warning(config.precision_caveat())
        done = enqueue(data.database_url(), model.strip(), checkpoints.strip() or None, config,
                       device=device.strip() or "cpu", force=force)
    except (EnqueueError, ValueError) as exc:
        st.error(str(exc))
        return
    except QueuedWithoutBroker as exc:
        st.warning(str(exc))
        data.jobs.clear()
        return
    except Exception as exc:  # broker unreachable (nothing written) and the like
        st.error(f"Could not queue: {type(exc).__name__}: {exc}")
        return
    stored = sum(j.stored for j in done)
    new = sum(j.created for j in done) - stored
    st.success(f"{new} job(s) queued, {len(done) - new - stored} existed already, {stored} "
               "already in the catalog: "
               + ", ".join(f"#{j.job_id} (step {j.step})" for j in done))
    data.jobs.clear()
