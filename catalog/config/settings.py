"""Every environment variable the project reads, in one validated object.

Nothing else in ``catalog``, ``schema``, ``jobs`` or ``ui`` reads ``os.environ`` but four
modules that must read a variable before or without the settings (docs/layout.md names
them; tests/unit/test_layers.py holds the list): code asks ``get_settings()`` (or takes a
``Settings`` argument, which is how tests and the demo pass their own values without
touching the process environment). The module lives in ``catalog`` because that is the
one package every other layer may import, and it imports nothing heavier than pydantic,
so the worker's parent process and the job commands stay free of torch.

The configuration table of docs/deployment.md lists the same variables (a test keeps them
equal).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_home() -> Path:
    return Path.home() / ".cache" / "neuron-catalog"


class Settings(BaseSettings):
    """Environment settings. Field ``x`` is read from the variable ``X`` (case-insensitive);
    a bad value raises a ``ValidationError`` that names the variable."""

    model_config = SettingsConfigDict(env_prefix="", extra="ignore", frozen=True)

    database_url: str | None = Field(
        None, description="PostgreSQL URL; unset: localhost:5432 if it answers, else an "
                          "embedded server in NCAT_HOME/pgdata")
    redis_url: str | None = Field(
        None, description="Redis URL of the job broker; unset: localhost:6379 if it answers, "
                          "else an embedded redis-server in NCAT_HOME/redis")
    ncat_reader_password: SecretStr | None = Field(
        None, description="password of the analysts' role catalog_reader, for servers that "
                          "authenticate by password (scram-sha-256); `ncat migrate` sets it "
                          "and the explorer's readers use it; unset: no password (trust)")
    ncat_home: Path = Field(
        default_factory=_default_home,
        description="the catalog's own files: built-in checkpoints, embedded servers, logs")
    ncat_queue: str = Field("ncat", min_length=1, description="Celery queue the jobs go to")
    ncat_visibility_timeout: int = Field(
        6 * 3600, ge=1, description="seconds before Redis re-delivers an unacknowledged task; "
                                    "longer than the longest layer")
    ncat_batch_size: int | None = Field(
        None, ge=1, description="a worker's prompts per forward pass (execution only; "
                                "default 4096)")
    ncat_patch_chunk: int | None = Field(
        None, ge=1, description="a worker's neurons per batched patching forward "
                                "(execution only; default 64)")
    ncat_activation_budget: int = Field(
        2 * 1024**3, ge=0, description="bytes of activations a worker keeps from one grid "
                                       "pass; over it, layers are captured one at a time")
    ncat_memory_budget: str | None = Field(
        None, description="host memory a run may use (12G, 512M or bytes); a request "
                          "estimated over it is refused before loading; unset: the memory "
                          "available at the time")
    ncat_busy_retry_seconds: float = Field(
        30.0, gt=0, description="seconds before a layer whose lock another session holds is "
                                "tried again")
    ncat_heartbeat_seconds: float = Field(
        30.0, gt=0, description="how often a working worker writes its layer's heartbeat")
    ncat_stale_seconds: float = Field(
        300.0, gt=0, description="a queued or running layer with no lock holder, no message "
                                 "waiting in the broker and no heartbeat for this long is "
                                 "sent again by the reconciler")
    ncat_reconcile_seconds: float = Field(
        60.0, gt=0, description="how often each worker's reconciler looks for stale layers "
                                "and unfinished summaries")
    ncat_explain_max_neurons: int = Field(
        20_000, ge=0, description="the largest model (MLP neurons over every layer) the "
                                  "explorer's Prompt page explains in its own process; "
                                  "larger ones go to a worker as a job (jobs.explain_jobs) "
                                  "and show what it stored")
    ncat_fit_cache_bytes: int = Field(
        4 * 1024**3, ge=0, description="bytes of the label rule's fits (they depend on the "
                                       "config and the operand grid, not the weights) kept "
                                       "in NCAT_HOME/fits for the next process, least "
                                       "recently used removed first; 0: none kept")
    ncat_max_attempts: int = Field(
        5, ge=1, description="a layer lost this many times since it was last queued (its "
                             "process died, its task or its database connection was lost) "
                             "fails its job")
    ncat_child_startup_seconds: float = Field(
        120.0, gt=0, description="how long a worker's new pool process may take to start "
                                 "(imports torch) before Celery gives up on it")
    ncat_broker_timeout_seconds: float = Field(
        30.0, gt=1, description="how long a broker connection may wait to connect or for an "
                                "answer before Celery says it cannot connect and tries again")
    ncat_explorer_port: int = Field(8501, gt=0, lt=65536,
                                    description="port of `ncat explore` and `ncat demo`")
    local_pg_host: str = Field("localhost", description="where to look for a local PostgreSQL")
    local_pg_port: int = Field(5432, gt=0, lt=65536, description="its port")

    @property
    def builtin_root(self) -> Path:
        """Where built-in model checkpoints are cached."""
        return self.ncat_home / "builtin"


# fields whose values are never shown in an error (a URL may hold a password)
_SECRET = frozenset({"database_url", "redis_url", "ncat_reader_password"})


class SettingsError(ValueError):
    """An environment variable the settings cannot take: the message names each variable,
    what is wrong with it and (but for URLs and passwords) the value given."""


def get_settings(**overrides) -> Settings:
    """The settings of this process's environment (fields in ``overrides`` replace them);
    ``SettingsError`` naming every variable that is wrong."""
    from pydantic import ValidationError

    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise SettingsError(settings_problem(exc)) from None


def settings_problem(exc) -> str:
    """One line per bad variable of a pydantic ``ValidationError`` of ``Settings``."""
    parts = []
    for err in exc.errors():
        field = str(err["loc"][0]) if err.get("loc") else "?"
        shown = "" if field in _SECRET else f"={err.get('input')!r}"
        parts.append(f"{field.upper()}{shown}: {err['msg'].lower()}")
    return "bad environment variable" + ("s" if len(parts) > 1 else "") + ": " + "; ".join(
        parts)


def child_env(settings: Settings | None = None, **extra: str) -> dict[str, str]:
    """The environment for a child process (a worker, the explorer, the trainer): this
    process's environment, the given settings written back as variables, and ``extra``."""
    env = dict(os.environ)
    if settings is not None:
        for name, value in settings.model_dump().items():
            if isinstance(value, SecretStr):  # str() of it is asterisks
                value = value.get_secret_value()
            if value is not None:
                env[name.upper()] = str(value)
    env.update(extra)
    return env
