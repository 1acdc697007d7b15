"""Prompts explained by a real Celery worker (jobs.explain_jobs): the Prompt page's route
for models too large to explain in the explorer's process. A request is checked before
anything is recorded, joined rather than queued twice, explained by the worker with the
catalog's labels exactly as explain() does in-process, and stored with the request's end;
a bad request that reaches a worker fails with the error's message; a message delivered
again after the request is done changes nothing."""

from __future__ import annotations

import re

import pytest

from catalog.config import ScienceConfig
from catalog.explain.holds import catalog_context
from catalog.explain.prompt import PromptError, explain, labels_from_rows
from catalog.sources import load_model
from jobs.explain_jobs import request, resend
from jobs.store_results import catalog_checkpoint
from schema import store
from schema.explain_requests import latest_request, request_explanation
from schema.explanations import labels_at, stored_explanation

from helpers import wait_until

CONFIG = ScienceConfig(operators=("+", "-"), operand_hi=20, pairs_per_op=10,
                       patching=("attribution",), faithfulness_prompts=20)


def _state(url, ids, prompt):
    with store.connect(url) as conn:
        return latest_request(conn, checkpoint_id=ids.checkpoint_id, config_id=ids.config_id,
                              prompt=prompt)


def test_a_worker_explains_a_requested_prompt_as_explain_does(queue, tiny_builtin):
    cfg, root = tiny_builtin
    lm = load_model("builtin", 300, builtin_config=cfg, cache_root=root)
    ids = catalog_checkpoint(queue.url, lm, CONFIG)
    where = dict(model_id=ids.model_id, checkpoint_id=ids.checkpoint_id,
                 config_id=ids.config_id)
    sent: list[int] = []

    # checked before anything is recorded: each names what is wrong
    for bad, message in (("what is 2+2", "not an arithmetic prompt"),
                         ("25+3=", "must be in the config's range [0, 20)"),
                         ("3*4=", "operator '*' is not measured"),
                         ("3-9=", "negative")):
        with pytest.raises(PromptError, match=re.escape(message)):
            request(queue.url, **where, prompt=bad, send=sent.append)
    with store.connect(queue.url) as conn:
        assert conn.execute("SELECT count(*) FROM explain_request").fetchone()[0] == 0
    assert sent == []

    # written as the catalog writes it; a second request of the prompt joins the first
    first, created = request(queue.url, **where, prompt=" 13 + 6 ", send=sent.append)
    again, created_again = request(queue.url, **where, prompt="13+6=", send=sent.append)
    assert created and not created_again and again.id == first.id
    assert first.prompt == "13+6=" and first.status == "queued" and sent == [first.id]

    # a request that only a worker can find bad (recorded past the checks above)
    with store.connect(queue.url, autocommit=True) as conn:
        bad, _ = request_explanation(conn, **where, prompt="3-9=", seeds=0)
    for request_id in (first.id, bad.id):
        resend(queue.url, request_id)  # through the broker this time
    queue.start_worker()
    wait_until(lambda: _state(queue.url, ids, "13+6=").status == "done"
               and _state(queue.url, ids, "3-9=").status == "failed",
               timeout=240, what="the worker's explanations")
    failed = _state(queue.url, ids, "3-9=")
    assert "negative" in failed.error and failed.starts == 1

    # the stored explanation is explain()'s with the catalog's labels
    with store.connect(queue.url) as conn:
        got_labels = labels_at(conn, checkpoint_id=ids.checkpoint_id,
                               config_id=ids.config_id, op="+")
        rows = got_labels.rows
        got = stored_explanation(conn, checkpoint_id=ids.checkpoint_id,
                                 config_id=ids.config_id, prompt="13+6=")
        written = conn.execute("SELECT written_at FROM prompt_explanation").fetchone()[0]
        assert stored_explanation(conn, checkpoint_id=ids.checkpoint_id,
                                  config_id=ids.config_id, prompt="3-9=") is None
    assert rows, "the checkpoint has labels for +"
    want = explain(lm.model, lm.tokenizer, "13+6=", CONFIG, labels=labels_from_rows(rows),
                   top=15, seeds=5, **catalog_context(got_labels, lm.model, CONFIG)).to_dict()
    assert got["target"] == pytest.approx(want["target"], rel=1e-5)
    assert got["shares"] == pytest.approx(want["shares"], rel=1e-4, abs=1e-6)
    assert [(r["layer"], r["neuron"]) for r in got["toward"]] == \
        [(r["layer"], r["neuron"]) for r in want["toward"]]
    assert [[x["label"] for x in r["labels"]] for r in got["toward"]] == \
        [[x["label"] for x in r["labels"]] for r in want["toward"]]
    assert (got["knockout"] is None) == (want["knockout"] is None)
    if want["knockout"] is not None:
        assert got["knockout"]["neurons"] == [list(n) for n in want["knockout"]["neurons"]]
        assert got["knockout"]["p_knocked"] == pytest.approx(want["knockout"]["p_knocked"],
                                                             rel=1e-4)
        # the controls and what the label adds, stored as explain() gives them
        assert set(got["knockout"]["controls"]) == set(want["knockout"]["controls"])
        assert got["knockout"]["label_adds"] == pytest.approx(
            want["knockout"]["label_adds"], rel=1e-3, abs=1e-6)
    assert [[(x["label"], x["side"], x["holds"]) for x in r["labels"]] for r in got["toward"]] \
        == [[(x["label"], x["side"], x["holds"]) for x in r["labels"]] for r in want["toward"]]

    # the same message delivered again: dropped, nothing rewritten
    resend(queue.url, first.id)
    wait_until(lambda: queue.worker_log().count("skipped (done, failed or unknown)") >= 1,
               timeout=120, what="the repeated message to be dropped")
    with store.connect(queue.url) as conn:
        assert conn.execute("SELECT written_at FROM prompt_explanation").fetchone()[0] \
            == written
    done = _state(queue.url, ids, "13+6=")
    assert done.starts == 1 and done.error is None and done.finished_at is not None
