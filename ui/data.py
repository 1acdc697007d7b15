"""What the explorer reads, cached: the statements are ``schema.explorer_reads``' (and
``schema.reads``', ``schema.jobs``'); this module adds the pooled engine (a cached
resource, one pool per server process) and caches results for a few seconds, so running
jobs show up without hammering the database.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pandas as pd
import streamlit as st
from sqlalchemy import create_engine

from catalog.config.settings import get_settings
from schema import console, reads, store
from schema import explorer_reads as reads_x
from schema import jobs as jobdb
from schema.database import resolve_database_url, with_driver

# the search's names, for the pages (``data.Filters``, ``data.SORTS``...)
from schema.explorer_reads import COUNT_CAP as COUNT_CAP
from schema.explorer_reads import SORTS as SORTS
from schema.explorer_reads import SPECTRUM_AXES as SPECTRUM_AXES
from schema.explorer_reads import Filters as Filters
from schema.explorer_reads import search_sql as search_sql
from schema.sketch import StoredGrid

TTL = 5  # seconds a query result is reused
SQL_ROW_CAP = 1000
SQL_TIMEOUT_MS = 5000
SQL_MAX_ROW_BYTES = 1 << 20  # a larger row is shown as NULLs
# fetching stops past this many bytes of rows, counted as Python objects here (a float8
# array: about 32 bytes per element), so that many sessions at once stay bounded
SQL_MAX_BYTES = 8 << 20
SQL_CONCURRENT = 2  # console queries at once in this explorer process; others wait
SQL_WAIT_S = 20.0  # how long a console query waits for its turn


@st.cache_resource
def database_url() -> str:
    url = get_settings().database_url
    return with_driver(url) if url else resolve_database_url()


@st.cache_resource
def engine():
    from schema.database import connect_args

    url = database_url()
    return create_engine(url, pool_pre_ping=True, connect_args=connect_args(url))


@st.cache_data(ttl=5)
def unreachable() -> str | None:
    """Why the catalog database cannot be used right now (one line, no secret), or None
    when it answers: every page says this instead of an empty catalog or a traceback."""
    from schema.engine import connection_problem

    try:
        with engine().connect() as conn:
            reads_x.ping(conn)
        return None
    except Exception as exc:  # noqa: BLE001 - whatever it is, the page says it
        return connection_problem(exc, database_url())


@st.cache_data(ttl=TTL)
def has_catalog() -> bool:
    try:
        with engine().connect() as conn:
            return reads_x.has_catalog(conn)
    except Exception:
        return False


@st.cache_data(ttl=TTL)
def models() -> pd.DataFrame:
    with engine().connect() as conn:
        return reads_x.models(conn)


@st.cache_data(ttl=TTL)
def checkpoints(model_id: int) -> pd.DataFrame:
    """Checkpoints with stored results: step, weights hash, accuracy and faithfulness."""
    with engine().connect() as conn:
        return reads_x.checkpoints(conn, model_id)


@st.cache_data(ttl=TTL)
def headline_faithfulness(model_id: int) -> pd.DataFrame:
    with engine().connect() as conn:
        return reads_x.headline_faithfulness(conn, model_id)


@st.cache_data(ttl=TTL)
def config_hashes(model_id: int) -> dict[int, str]:
    with engine().connect() as conn:
        return reads_x.config_hashes(conn, model_id)


@st.cache_data(ttl=TTL)
def configs(model_id: int) -> pd.DataFrame:
    with engine().connect() as conn:
        return reads_x.configs(conn, model_id)


@st.cache_data(ttl=2)
def jobs(limit: int = 50) -> pd.DataFrame:
    """The newest jobs with their progress (schema.jobs.progress, the one such query)."""
    with store.connect(database_url()) as conn:
        rows = jobdb.progress(conn, newest_first=True, limit=limit)
    return pd.DataFrame(
        [(r.job_id, r.model, r.step, r.status, r.layers_total, r.layers_done, r.error,
          r.failed_layer, r.updated_at) for r in rows],
        columns=["id", "model", "step", "status", "layers", "done", "error", "failed_layer",
                 "updated_at"])


@st.cache_data(ttl=10, show_spinner=False)
def workers_listening() -> int | None:
    """Workers consuming this catalog's queue that answer on the broker within a second;
    None where the broker does not answer (the page says nothing then)."""
    from jobs.celery_app import workers_on_queue

    try:
        return workers_on_queue(timeout=1.0)
    except Exception:  # noqa: BLE001 - an unreachable broker: no hint rather than an error
        return None


@st.cache_data(ttl=TTL)
def families() -> list[str]:
    with engine().connect() as conn:
        return reads_x.families(conn)


@st.cache_data(ttl=TTL)
def search(f: Filters, page: int, page_size: int = 50,
           cap: int = COUNT_CAP) -> tuple[pd.DataFrame, int]:
    """One page of neurons matching the filters, and how many match in all, counted up
    to `cap` (schema.explorer_reads.search)."""
    with engine().connect() as conn:
        return reads_x.search(conn, f, page, page_size, cap)


def stored_grid(model_id, checkpoint_id, config_id, layer, neuron, op,
                kv=False) -> StoredGrid | None:
    """A grid as stored: full, or a sketch (schema.sketch); None if there is none. Whether
    the row is a sketch is read every time (one indexed row) and is part of the cache key,
    so a full grid that a job wrote over a sketch shows at once, never a cached sketch."""
    with engine().connect() as conn:  # the pooled engine: no new connection per grid
        sketch = reads_x.grid_is_sketch(conn, model_id, checkpoint_id, config_id, layer,
                                        neuron, op)
    if sketch is None:
        return None
    return _stored_grid(model_id, checkpoint_id, config_id, layer, neuron, op, kv, sketch)


@st.cache_data(ttl=TTL)
def _stored_grid(model_id, checkpoint_id, config_id, layer, neuron, op, kv,
                 sketch: bool) -> StoredGrid | None:
    with store.connect(database_url()) as conn:
        try:
            return reads.read_stored_grid(conn, model_id=model_id, checkpoint_id=checkpoint_id,
                                   config_id=config_id, layer=layer, neuron=neuron, op=op,
                                   kv=kv)
        except KeyError:
            return None


def grid(model_id, checkpoint_id, config_id, layer, neuron, op, kv=False) -> np.ndarray | None:
    """A grid's (side, side) values (a sketch's cells hold their block's mean)."""
    g = stored_grid(model_id, checkpoint_id, config_id, layer, neuron, op, kv)
    return None if g is None else g.values


@st.cache_data(ttl=TTL)
def recent_config() -> tuple[int, dict] | None:
    """(config id, stored config) of the most recent job, else of the newest stored config:
    where the job form starts, so that a checkpoint the catalog has is found done."""
    with engine().connect() as conn:
        return reads_x.recent_config(conn)


@st.cache_data(ttl=TTL)
def job_request(model_id: int, checkpoint_id: int, config_id: int) -> tuple[str, int | None,
                                                                           dict]:
    """(model name, step, stored config) of a catalogued checkpoint: what a job needs."""
    with engine().connect() as conn:
        return reads_x.job_request(conn, model_id, checkpoint_id, config_id)


@st.cache_data(ttl=TTL)
def link_names(model_id: int, checkpoint_id: int, config_id: int):
    with engine().connect() as conn:
        return reads_x.link_names(conn, model_id, checkpoint_id, config_id)


@st.cache_data(ttl=TTL)
def resolve_link(model: str, step: int | None, config: str | None):
    with engine().connect() as conn:
        return reads_x.resolve_link(conn, model, step, config)


@st.cache_data(ttl=TTL)
def layout(config_id: int) -> pd.DataFrame:
    with engine().connect() as conn:
        return reads_x.layout(conn, config_id)


@st.cache_data(ttl=TTL)
def neuron_ops(model_id, checkpoint_id, config_id, layer, neuron) -> pd.DataFrame:
    with engine().connect() as conn:
        return reads_x.neuron_ops(conn, model_id, checkpoint_id, config_id, layer, neuron)


@st.cache_data(ttl=TTL)
def spectrum(model_id, checkpoint_id, config_id, layer, neuron) -> pd.DataFrame:
    """The neuron's row of ``neuron_spectrum`` per operator (empty without spectra)."""
    with engine().connect() as conn:
        return reads_x.spectrum(conn, model_id, checkpoint_id, config_id, layer, neuron)


@st.cache_data(ttl=TTL)
def counterparts(checkpoint_id, config_id, layer, neuron) -> pd.DataFrame:
    """The neuron's stored counterparts in other checkpoints (``ncat counterparts``)."""
    from schema.counterparts import counterparts_of

    with engine().connect() as conn:
        return counterparts_of(conn, checkpoint_id=int(checkpoint_id),
                               config_id=int(config_id), layer=int(layer),
                               neuron=int(neuron))


@st.cache_data(ttl=TTL)
def layer_patching(checkpoint_id, config_id, layer) -> dict:
    """op -> {"n_pairs", "n_exact", "spearman"} of one stored layer ({} if not recorded)."""
    with engine().connect() as conn:
        return reads_x.layer_patching(conn, checkpoint_id, config_id, layer)


@st.cache_data(ttl=TTL)
def lens(model_id, checkpoint_id, config_id, layer, neuron) -> dict | None:
    with engine().connect() as conn:
        return reads_x.lens(conn, model_id, checkpoint_id, config_id, layer, neuron)


@st.cache_data(ttl=TTL)
def matches(model_id, checkpoint_id, config_id, layer, neuron, limit: int = 200):
    with engine().connect() as conn:
        return reads_x.matches(conn, model_id, checkpoint_id, config_id, layer, neuron, limit)


@st.cache_data(ttl=TTL)
def evolution(model_id, config_id, layer, neuron) -> pd.DataFrame:
    with engine().connect() as conn:
        return reads_x.evolution(conn, model_id, config_id, layer, neuron)


@st.cache_data(ttl=TTL)
def periodic_through_training(model_id: int) -> pd.DataFrame:
    """Per config, step and axis, the share of live maps whose dominant period is
    significant (the packed bits of neuron_op.spec_helix); empty, after one probe of a
    partial index, for a model without periodic maps (most catalogs measure no spectra)."""
    with engine().connect() as conn:
        return reads_x.periodic_through_training(conn, model_id)


@st.cache_data(ttl=TTL)
def census(model_id: int, config_id: int) -> pd.DataFrame:
    with engine().connect() as conn:
        return reads_x.census(conn, model_id, config_id)


@st.cache_data(ttl=TTL)
def emergence(model_id: int, config_id: int) -> pd.DataFrame:
    with engine().connect() as conn:
        return reads_x.emergence(conn, model_id, config_id)


@st.cache_data(ttl=TTL)
def overlap(model_id: int, config_id: int) -> pd.DataFrame:
    with engine().connect() as conn:
        return reads_x.overlap(conn, model_id, config_id)


# ------------------------------------------------------------------ the SQL console

ConsoleError = console.ConsoleError


_CONSOLE_TURNS = threading.BoundedSemaphore(SQL_CONCURRENT)


@contextlib.contextmanager
def console_turn():
    """One of SQL_CONCURRENT turns of this process's console, held while a query runs and
    its table is drawn (both hold its rows); ConsoleError if none frees up in SQL_WAIT_S."""
    if not _CONSOLE_TURNS.acquire(timeout=SQL_WAIT_S):
        raise ConsoleError(f"The SQL console is busy: {SQL_CONCURRENT} queries are running in "
                           f"this explorer; try again in a moment.")
    try:
        yield
    finally:
        _CONSOLE_TURNS.release()


def run_console(sql: str, row_cap: int | None = None) -> console.ConsoleResult:
    """One read-only statement as the analysts' role (schema.console: one statement,
    read-only transaction rolled back, rows, bytes and time bounded)."""
    return console.run(database_url(), sql, row_cap=row_cap or SQL_ROW_CAP,
                       timeout_ms=SQL_TIMEOUT_MS, max_row_bytes=SQL_MAX_ROW_BYTES,
                       max_bytes=SQL_MAX_BYTES)


@st.cache_data(ttl=TTL)
def circuits(model_id: int, checkpoint_id: int, config_id: int):
    """Component effects, circuit curves and the residual lens of one checkpoint
    (schema.report_reads.CircuitData)."""
    from schema.report_reads import gather_circuits

    with store.connect(database_url()) as conn:
        return gather_circuits(conn, model_id, checkpoint_id, config_id)


@st.cache_data(ttl=60, show_spinner=False)
def summary_explained(checkpoint_id: int, config_id: int) -> dict:
    """op -> the checkpoint summary's prompts explained (schema.explanations)."""
    from schema.explanations import summary_explained as read

    with store.connect(database_url()) as conn:
        return read(conn, checkpoint_id=checkpoint_id, config_id=config_id)


@st.cache_data(ttl=60, show_spinner=False)
def prompt_labels(checkpoint_id: int, config_id: int, op: str):
    """The labels of ``op`` at a catalogued checkpoint (with their sides), each neuron's
    mean activation, mean KV value and rank (schema.explanations.labels_at)."""
    from schema.explanations import labels_at

    with store.connect(database_url()) as conn:
        return labels_at(conn, checkpoint_id=checkpoint_id, config_id=config_id, op=op)


@st.cache_data(ttl=TTL)
def stored_prompt(model_id: int, config_id: int, prompt: str) -> list[dict]:
    """The prompt's stored explanations at each checkpoint (``ncat explain --store``)."""
    from schema.explanations import across_checkpoints

    with store.connect(database_url()) as conn:
        return across_checkpoints(conn, model_id=model_id, config_id=config_id, prompt=prompt)


def worker_explanation(checkpoint_id: int, config_id: int, prompt: str):
    """(the prompt's stored explanation or None, its latest worker request or None), read
    fresh on every call: a worker may finish between two reruns."""
    from schema.explain_requests import latest_request
    from schema.explanations import stored_explanation

    with store.connect(database_url()) as conn:
        return (stored_explanation(conn, checkpoint_id=checkpoint_id, config_id=config_id,
                                   prompt=prompt),
                latest_request(conn, checkpoint_id=checkpoint_id, config_id=config_id,
                               prompt=prompt))


@st.cache_data(ttl=TTL, show_spinner=False)
def training(model: str, config_id: int | None):
    """The training figures' rows of ``model``'s group (its seeds) under a config
    (schema.training.gather_training); None without summaries."""
    from schema.training import gather_training

    with store.connect(database_url()) as conn:
        return gather_training(conn, model=model, config_id=config_id)
