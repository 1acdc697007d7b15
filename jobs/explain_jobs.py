"""Prompts explained by a worker: models too large for the explorer's own process.

``request(url, model_id, checkpoint_id, config_id, prompt, seeds)`` checks the prompt
against the checkpoint's config (the arithmetic, the operator, the range: the errors
``ncat explain`` gives, before anything is queued), records a request
(``schema.explain_requests``; a prompt already queued or running is joined, not queued
again) and sends the ``ncat.explain_prompt`` task, naming its catalog (schema.identity);
``resend`` sends an open request's task again (its message lost with a restarted
broker). A worker runs ``process``: it
claims the request, loads the model on its GPU when it has one (the model of the layer
job it last ran is reused when it is the same checkpoint), explains the prompt with the
catalog's labels of its operator and writes the explanation and the request's end in one
transaction; an error the prompt or the model causes fails the request with its message,
which the Prompt page shows.
"""

from __future__ import annotations

import logging

from catalog.config import ScienceConfig
from catalog.config.settings import get_settings
from jobs.enqueue import broker_failed
from schema import store
from schema.database import first_line
from schema.explain_requests import (
    ExplainRequest,
    claim_request,
    fail_request,
    finish_request,
    request_explanation,
    request_target,
)

log = logging.getLogger(__name__)

_MODEL: tuple | None = None  # (name, step, dtype, device) and the loaded model


def _target(conn, model_id: int, checkpoint_id: int, config_id: int
            ) -> tuple[str, int | None, ScienceConfig]:
    name, step, config = request_target(conn, model_id=model_id,
                                        checkpoint_id=checkpoint_id, config_id=config_id)
    return name, step, ScienceConfig.from_dict(config)


def request(url: str, *, model_id: int, checkpoint_id: int, config_id: int, prompt: str,
            seeds: int = 5, send=None) -> tuple[ExplainRequest, bool]:
    """(the request, whether it was created here): checked, recorded, then sent. Raises
    ``catalog.explain.prompt.PromptError`` (or ValueError) naming what is wrong, with
    nothing recorded."""
    import numpy as np

    from catalog.core.arith import is_valid
    from catalog.explain.prompt import PromptError, parse

    with store.connect(url, autocommit=True) as conn:
        a, op, b = parse(prompt, _target(conn, model_id, checkpoint_id, config_id)[2])
        if not is_valid(op, np.array([a]), np.array([b]), 10**12)[0]:
            raise PromptError(f"{a}{op}{b} is not a prompt the catalog measures (a result "
                              "that is negative or not a whole number)")
        text = f"{a}{op}{b}="
        got, created = request_explanation(conn, model_id=model_id,
                                           checkpoint_id=checkpoint_id,
                                           config_id=config_id, prompt=text, seeds=seeds)
    if created:
        try:
            (send or _sender(url))(got.id)
        except Exception as exc:
            if broker_failed(exc):
                raise NotSent(got, exc) from exc
            raise
    return got, created


class NotSent(RuntimeError):
    """The request is recorded but the broker failed while its message was sent."""

    def __init__(self, req: ExplainRequest, cause: BaseException) -> None:
        first = first_line(cause)
        super().__init__(f"explain request #{req.id} is recorded, but the job broker failed "
                         f"while its message was sent ({type(cause).__name__}: {first}); "
                         "send it again once the broker answers")
        self.request = req


def resend(url: str, request_id: int, send=None) -> None:
    """Send an open request's task again (a worker drops a message whose request is
    already done or failed, so a duplicate costs nothing)."""
    (send or _sender(url))(request_id)


def _sender(url: str):
    """``send(request_id)`` through the broker, naming the catalog at ``url``."""
    from jobs.celery_app import app, send_explanation
    from schema.identity import identity_of

    catalog = identity_of(url)

    def send(request_id: int) -> None:
        send_explanation(app, request_id, catalog=catalog)

    return send


def _model(name: str, step: int | None, config: ScienceConfig):
    """The model on this worker's device: the layer job's if it is the same checkpoint
    and dtype, else one kept here (the previous one freed first)."""
    global _MODEL
    import torch

    from catalog.sources import load_model
    from jobs import runner

    device = "cuda" if torch.cuda.is_available() else "cpu"
    key = (name, step, str(config.torch_dtype()), device)
    current = runner._CURRENT
    if current is not None and (current.key[0], current.key[1], current.key[2]) == (
            name, step, device) and current.lm.model.cfg.dtype == config.torch_dtype():
        return current.lm
    if _MODEL is None or _MODEL[0] != key:
        _MODEL = None
        _MODEL = (key, load_model(name, step, device=device, dtype=config.torch_dtype(),
                                  cache_root=get_settings().builtin_root, progress=False))
    return _MODEL[1]


def process(url: str, request_id: int, worker: str) -> str:
    """Explain one request's prompt and store it (module doc); what happened, in words."""
    from catalog.explain.holds import catalog_context
    from catalog.explain.prompt import PromptError, explain, labels_from_rows, parse
    from catalog.sources import ModelSourceError
    from schema.explanations import labels_at

    with store.connect(url, autocommit=True) as conn:
        req = claim_request(conn, request_id, worker)
        if req is None:
            return "skipped (done, failed or unknown)"
        try:
            name, step, config = _target(conn, req.model_id, req.checkpoint_id,
                                         req.config_id)
            _, op, _ = parse(req.prompt, config)
            got = labels_at(conn, checkpoint_id=req.checkpoint_id, config_id=req.config_id,
                            op=op)
            lm = _model(name, step, config)
            e = explain(lm.model, lm.tokenizer, req.prompt, config,
                        labels=labels_from_rows(got.rows), top=15, seeds=req.seeds,
                        **catalog_context(got, lm.model, config))
        except (PromptError, ModelSourceError, ValueError) as exc:
            fail_request(conn, req.id, str(exc))
            return f"failed: {exc}"
        except Exception as exc:
            fail_request(conn, req.id, f"{type(exc).__name__}: {exc}")
            raise
        finish_request(conn, req, e.to_dict())
    return "done"
