"""docker-compose.yml and the Dockerfile, checked by reading them (no Docker engine here)."""

import shlex
from pathlib import Path

import yaml

from jobs.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def compose():
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def ncat_commands() -> set[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return set(sub.choices)


def test_services_healthchecks_and_dependencies():
    services = compose()["services"]
    assert set(services) == {"postgres", "redis", "migrate", "worker", "worker-cpu",
                             "explorer"}
    for name in ("postgres", "redis"):
        check = services[name]["healthcheck"]["test"]
        assert check[0] in ("CMD", "CMD-SHELL") and len(check) > 1
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("worker", "worker-cpu", "explorer"):
        deps = services[name]["depends_on"]
        assert deps["migrate"]["condition"] == "service_completed_successfully"
        assert deps["redis"]["condition"] == "service_healthy"
    gpu = services["worker"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["capabilities"] == ["gpu"] and gpu["driver"] == "nvidia"
    # a CPU-only route: the GPU worker and the CPU worker each in a profile of its own,
    # the CPU worker asking for no device; everything else starts with no profile named
    assert services["worker"]["profiles"] == ["gpu"]
    assert services["worker-cpu"]["profiles"] == ["cpu"]
    assert "deploy" not in services["worker-cpu"]
    assert services["worker-cpu"]["command"][:2] == ["ncat", "worker"]
    assert all("profiles" not in services[n]
               for n in ("postgres", "redis", "migrate", "explorer"))
    # the CPU worker inherits the image and every setting of the others (a merge, not
    # an environment of its own that would drop DATABASE_URL)
    assert services["worker-cpu"]["environment"] == services["worker"]["environment"]
    assert services["worker-cpu"]["image"] == services["worker"]["image"]
    # published on the loopback unless the user names an interface; no default password
    assert services["explorer"]["ports"] == [
        "${EXPLORER_BIND:-127.0.0.1}:${EXPLORER_PORT:-8501}:8501"]
    text = (ROOT / "docker-compose.yml").read_text()
    assert "POSTGRES_PASSWORD:-" not in text and "${POSTGRES_PASSWORD:?" in text
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith(
        "${POSTGRES_PASSWORD:?")
    # the analysts' role logs in by password under the image's scram-sha-256: one the
    # user sets, never a shipped one, given to every service that reads as it
    for name in ("migrate", "worker", "worker-cpu", "explorer"):
        assert services[name]["environment"]["NCAT_READER_PASSWORD"].startswith(
            "${NCAT_READER_PASSWORD:?"), name
    # the postgres image runs the script that confines the reader to the catalog's database
    mount = "./scripts/postgres-init:/docker-entrypoint-initdb.d:ro"
    assert mount in services["postgres"]["volumes"]
    assert (ROOT / "scripts" / "postgres-init" / "10-reader-hba.sh").is_file()
    # the postgres image is built with the reader guard, from the files that exist, for
    # the server version the image runs, the way scripts/reader-guard.sh builds it
    guard = ROOT / services["postgres"]["build"]
    docker = (guard / "Dockerfile").read_text()
    major = docker.split("FROM postgres:", 1)[1].split()[0]
    assert services["postgres"]["image"].endswith(f":{major}")
    assert f"postgresql-server-dev-{major}" in docker
    assert "make -C /src with_llvm=no install" in docker
    assert "with_llvm=no" in (ROOT / "scripts" / "reader-guard.sh").read_text()
    for line in docker.splitlines():
        if line.startswith("COPY "):
            for src in shlex.split(line)[1:-1]:
                assert (guard / src).is_file(), src
    sources = {p.name for p in guard.iterdir()
               if p.suffix in (".c", ".h", ".control", ".sql") or p.name == "Makefile"}
    assert sources <= set(
        shlex.split(next(x for x in docker.splitlines() if x.startswith("COPY ")))[1:-1])
    # Redis keeps an append-only file on a volume: queued messages survive its restart
    redis_cmd = services["redis"]["command"]
    assert redis_cmd[redis_cmd.index("--appendonly") + 1] == "yes"
    assert any(v.endswith(":/data") for v in services["redis"]["volumes"])
    assert "redis-data" in compose()["volumes"]
    # the explorer (SQL console included) listens on all interfaces only inside its
    # container, and says so explicitly; `ncat explore` alone serves on localhost
    cmd = services["explorer"]["command"]
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
    assert build_parser().parse_args(["explore"]).host == "127.0.0.1"


def test_every_command_exists_in_the_project():
    from catalog.config.settings import Settings

    known = ncat_commands()
    read = {name.upper(): f for name, f in Settings.model_fields.items()}
    for name, service in compose()["services"].items():
        cmd = service.get("command")
        if name in ("migrate", "worker", "worker-cpu", "explorer"):
            assert cmd[0] == "ncat" and cmd[1] in known, (name, cmd)
            build_parser().parse_args(cmd[1:])  # the arguments are valid too
        env = service.get("environment", {})
        for key in ("DATABASE_URL", "REDIS_URL"):
            if name in ("migrate", "worker", "worker-cpu", "explorer"):
                assert key in env and ":-" in env[key]  # overridable, with a default
        for key, value in env.items():
            if key.startswith("NCAT_"):  # a setting the project reads, with a valid default
                assert key in read, key
                if value.startswith("${" + key + ":?"):  # required: no default to check
                    continue
                default = value.split(":-", 1)[1].rstrip("}")
                Settings(**{key.lower(): default})  # raises if the default is invalid


def test_dockerfile_copies_what_exists():
    text = (ROOT / "Dockerfile").read_text()
    assert "pip install --no-cache-dir torch==2.13.0" in text
    assert text.index("torch==2.13.0") < text.index("pip install --no-cache-dir .")
    copied = set()
    for line in text.splitlines():
        if line.startswith("COPY "):
            for src in shlex.split(line)[1:-1]:
                assert (ROOT / src).exists(), src
                copied.add(src.rstrip("/"))
    # every package `pip install .` installs is in the image: reports/ was added after the
    # Dockerfile and left out, and the explorer imports it (the image could not serve)
    import tomllib

    found = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = found["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.rstrip("*") for p in include}
    assert packages and packages <= copied, packages - copied
