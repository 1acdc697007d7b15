"""Selectors and empty states shared by the pages."""

from __future__ import annotations

from urllib.parse import quote, urlencode

import pandas as pd
import streamlit as st

from ui import data

EMPTY = ("The catalog is empty. Run the demo (`bash scripts/demo.sh`), or catalog a model: "
         "`ncat catalog builtin --checkpoints all`, or queue one on the Jobs page.")


def reachable() -> bool:
    """False, with the reason on the page, when the catalog database cannot be used
    (down, a refused login): the page then shows nothing else."""
    problem = data.unreachable()
    if problem is not None:
        st.error(f"The catalog cannot be reached: {problem}. Check DATABASE_URL (the "
                 "explorer's environment) and that PostgreSQL runs there; this page "
                 "tries again when reloaded.")
        return False
    return True


def require_catalog() -> bool:
    if not reachable():
        return False
    if not data.has_catalog():
        st.info(EMPTY)
        return False
    return True


def pick_model_checkpoint_config(key: str, across_training: bool = False):
    """Sidebar selectors, and a line on the page naming what it shows (the model, the
    checkpoint, or every checkpoint with ``across_training``, and the measurement config);
    returns (model row, checkpoint row, config id). A checkpoint's stable link
    (?model=..&step=..&config=..) picks the defaults."""
    models = data.models()
    names = models.name.tolist()
    linked = st.query_params.get("model")
    name = st.sidebar.selectbox("Model", names, key=f"{key}-model",
                                index=names.index(linked) if linked in names else 0)
    model = models[models.name == name].iloc[0]
    step, ck = _pick_checkpoint(key, int(model.id), linked == name)
    config_id, choice = _pick_config(key, int(model.id))
    where = "every checkpoint" if across_training else (
        "final weights" if pd.isna(step) else f"step {int(step)}")
    st.caption(f"{name} · {where} · measurement config {choice}")
    return model, ck, config_id


def _linked_step(steps: list, want: str | None) -> list[int]:
    """Positions in ``steps`` of the link's step ("final": a model without steps)."""
    return [i for i, s in enumerate(steps) if (pd.isna(s) and want == "final")
            or (not pd.isna(s) and want == str(int(s)))]


def _pick_checkpoint(key: str, model_id: int, linked: bool):
    """The checkpoint selector: (step, checkpoint row); the link's step where the link
    names this model, else the last."""
    cks = data.checkpoints(model_id)
    cks = cks[cks.config_id.notna()] if cks.config_id.notna().any() else cks
    cks = cks.drop_duplicates("checkpoint_id")
    steps = cks.step.tolist()
    at = _linked_step(steps, st.query_params.get("step")) if linked else []
    step = st.sidebar.selectbox("Checkpoint step", steps,
                                index=at[0] if at else len(steps) - 1, key=f"{key}-step",
                                format_func=lambda s: "(no steps)" if pd.isna(s) else str(int(s)))
    # a model without training steps (a GGUF file, a local directory) has step NULL
    ck = cks[cks.step.isna()].iloc[0] if pd.isna(step) else cks[cks.step == step].iloc[0]
    return step, ck


def _pick_config(key: str, model_id: int) -> tuple[int, str]:
    """The measurement config selector: (config id, its line); the link's config (a
    prefix of its hash) where one is given, else the first."""
    cfgs = data.configs(model_id)
    labels = [f"#{r.id}: ops {r.operators}, operands [{r.operand_lo}, {r.operand_hi}), "
              f"template {r.template!r}, {r.shots or 0} shots, labels: {r.label_rule or 'paper'}"
              for r in cfgs.itertuples()]
    hashes = data.config_hashes(model_id)
    wanted = st.query_params.get("config")
    cfg_at = [i for i, r in enumerate(cfgs.itertuples()) if wanted
              and str(hashes.get(int(r.id), "")).startswith(wanted)]
    choice = st.sidebar.selectbox("Measurement config", labels, key=f"{key}-config",
                                  index=cfg_at[0] if cfg_at else 0)
    return int(cfgs.id.iloc[labels.index(choice)]), choice


# A link names a checkpoint by model name, step ("final" for a model's only weights) and a
# prefix of the config's hash: the same link opens the same neuron in any catalog of the
# same model (database ids differ between catalogs), under the config it was made under
# however many the catalog comes to hold. Links with ids (before 0.11) still open, and are
# rewritten; links without a config (before issue 81, made when the model had one) open
# the checkpoint's first catalogued config, and the page says so.
ID_KEYS = ("model_id", "checkpoint_id", "config_id")
CONFIG_PREFIX = 12


def named_query(model: str, step: int | None, config_hash: str | None = None
                ) -> dict[str, str]:
    """The query parameters of a stable link."""
    out = {"model": model, "step": "final" if step is None else str(int(step))}
    if config_hash:
        out["config"] = config_hash[:CONFIG_PREFIX]
    return out


def stable_query(model_id, checkpoint_id, config_id) -> dict[str, str]:
    """The query parameters naming a catalogued checkpoint and config stably."""
    names = data.link_names(int(model_id), int(checkpoint_id), int(config_id))
    if names is None:
        return {k: str(v) for k, v in zip(ID_KEYS, (model_id, checkpoint_id, config_id),
                                            strict=True)}
    return named_query(*names)


def query_ids(qp) -> tuple[int, int, int] | None | str:
    """(model id, checkpoint id, config id) the page's query names: by name (a stable link),
    or by ids (an old link: the address bar is rewritten to the stable form). None when the
    query names no checkpoint; a message when it names one this catalog does not hold."""
    if "model" in qp:
        step_text = qp.get("step", "final")
        try:
            step = None if step_text == "final" else int(step_text)
        except ValueError:
            return f"step {step_text!r} is neither a number nor 'final'"
        found = data.resolve_link(qp["model"], step, qp.get("config"))
        if found is None:
            return (f"this catalog has no {qp['model']} at "
                    f"{'its final weights' if step is None else f'step {step}'}"
                    + (f" under config {qp['config']}" if qp.get("config") else ""))
        *ids, n_configs = found
        if not qp.get("config"):
            if n_configs > 1:
                st.info(f"This link names no measurement config, and the catalog holds "
                        f"{n_configs} at this checkpoint: showing the first catalogued "
                        f"(#{ids[2]}), the one a link made before it held others meant. "
                        "The address now names it.")
            rest = {k: qp[k] for k in qp if k not in ("model", "step", "config")}
            qp.from_dict({**stable_query(*ids), **rest})
        return tuple(ids)  # type: ignore[return-value]
    try:
        ids = tuple(int(qp[k]) for k in ID_KEYS)
    except (KeyError, ValueError):
        return None
    rest = {k: qp[k] for k in qp if k not in ID_KEYS}
    qp.from_dict({**stable_query(*ids), **rest})  # the old link, rewritten
    return ids  # type: ignore[return-value]


def link(page: str, model_id, checkpoint_id, config_id, **more) -> str:
    query = {**stable_query(model_id, checkpoint_id, config_id),
             **{k: str(v) for k, v in more.items() if v is not None}}
    return f"/{page}?" + urlencode(query, quote_via=quote)


def neuron_link(model_id, checkpoint_id, config_id, layer, neuron, op=None) -> str:
    return link("neuron", model_id, checkpoint_id, config_id, layer=layer, neuron=neuron, op=op)
