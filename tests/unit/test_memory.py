"""Memory as a budget (issue 33): a request's peak memory estimated from the model's
config before loading, a measure that stays within it, and a refusal before loading
when the budget is smaller."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from catalog.config import ExecutionConfig, ScienceConfig
from catalog.measuring.memory import (
    GIB,
    PROCESS_BYTES,
    Footprint,
    MemoryBudgetError,
    _glibc,
    estimate_memory,
    memory_budget,
    parse_bytes,
    request_memory,
)

ROOT = Path(__file__).resolve().parents[2]


def test_sizes_parse_with_binary_units_and_bad_ones_are_named():
    assert parse_bytes("12G") == 12 * GIB
    assert parse_bytes("512M") == 512 * 1024**2
    assert parse_bytes("1.5GiB") == int(1.5 * GIB)
    assert parse_bytes("8000") == 8000
    assert parse_bytes(" 2 tb ") == 2 * 1024**4
    for bad in ("", "12X", "G", "-1G", "1e9"):
        with pytest.raises(ValueError, match="NCAT_MEMORY_BUDGET must be a size"):
            parse_bytes(bad)


def test_the_budget_comes_from_the_flag_then_the_environment_then_the_machine(monkeypatch):
    monkeypatch.setenv("NCAT_MEMORY_BUDGET", "3G")
    assert memory_budget(5000) == (5000, "--memory-budget")
    assert memory_budget(0) == (3 * GIB, "NCAT_MEMORY_BUDGET")
    monkeypatch.delenv("NCAT_MEMORY_BUDGET")
    have, where = memory_budget(0)
    assert where == "the memory available on this machine"
    assert 0 < have <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_estimate_parts_follow_the_shape_and_the_activation_budget():
    # Qwen2.5-Coder-0.5B's footprint as its GGUF config gives it (630,167,424 parameters
    # with the tied unembedding counted twice); its load measured 3.78 GiB at its peak,
    # the process included (docs/memory.md, 2026-11-26: 5.91 before freed tensors went
    # back to the system and processing copied one tensor at a time)
    fp = Footprint("gguf", 630_167_424, 24, 896, 4864, 151_936)
    kw = dict(prompts=2_000, n_layers=24, pairs=50, n_ctx=40, dtype="float32", device="cpu",
              batch_size=4096, patch_chunk=64, exact=True)
    big = estimate_memory(fp, activation_budget=2 * GIB, **kw)
    load = PROCESS_BYTES + big.parts["loading (float32, converted)"]
    assert 3.78 * GIB <= load <= 1.5 * 3.78 * GIB  # an upper bound, not a wild one
    grid = 2_000 * 24 * 4864 * 4  # 0.87 GiB of activations: under the budget, kept
    one = estimate_memory(fp, activation_budget=grid - 1, **kw)  # over it: one layer's
    assert big.parts["measuring (host)"] - one.parts["measuring (host)"] == pytest.approx(
        grid - 2_000 * 4864 * 4)
    # on a GPU the weights, forwards and patching move there
    gpu = estimate_memory(fp, activation_budget=2 * GIB, **{**kw, "device": "cuda",
                                                            "dtype": "bfloat16"})
    assert gpu.gpu_peak >= 630_167_424 * 2
    assert gpu.parts["measuring (host)"] < big.parts["measuring (host)"]
    assert "GPU peak" in gpu.render() and "GPU peak" not in big.render()
    assert big.host_peak == PROCESS_BYTES + max(big.parts["loading (float32, converted)"],
                                                big.parts["measuring (host)"])


def test_a_streamed_gguf_load_is_estimated_from_the_weights_in_the_run_dtype():
    """Qwen2.5-Coder-0.5B loaded one tensor at a time (bench/load_memory.py, 2026-11-26,
    over the process): 1.66 GiB in bfloat16, 2.54 GiB in float32; the estimate is an
    upper bound within 1.5x of each, and far under the whole-file load's."""
    from catalog.measuring.memory import streamed_load

    fp = Footprint("gguf-streamed", 630_167_424, 24, 896, 4864, 151_936)
    for dtype, measured in (("bfloat16", 1.66), ("float32", 2.54)):
        estimate = streamed_load(fp, dtype) / GIB
        assert measured <= estimate <= 1.5 * measured, (dtype, estimate)
    kw = dict(prompts=10, n_layers=1, pairs=0, n_ctx=8, dtype="bfloat16", device="cpu",
              batch_size=16, patch_chunk=1, exact=False, activation_budget=GIB)
    streamed = estimate_memory(fp, **kw)
    whole = estimate_memory(Footprint("gguf", 630_167_424, 24, 896, 4864, 151_936), **kw)
    assert streamed.parts["loading (one tensor at a time)"] == streamed_load(fp, "bfloat16")
    assert streamed.host_peak < whole.host_peak - GIB


def _qwen_shape():
    """Qwen2.5-Coder-0.5B's shape as far as the estimate reads it (no tokenizer: prompts
    40 tokens long)."""
    from types import SimpleNamespace

    return SimpleNamespace(footprint=Footprint("gguf", 630_167_424, 24, 896, 4864, 151_936),
                           numbers=SimpleNamespace(digit_level=False, limit=999),
                           tokenizer=None, n_ctx=40)


def test_a_request_over_the_budget_is_sized_down_to_the_largest_chunk_that_fits():
    """Between the request's own estimate and its smallest one, the patch chunk is halved
    (every layer's activations kept while the chunk is 16 or more), then the activations
    are given up and the chunk halved again: the first setting that fits is taken, and
    the one before it did not fit. Under the smallest: refused, with that need."""
    from dataclasses import replace

    from catalog.measuring.memory import fit_request

    shape = _qwen_shape()
    config = ScienceConfig(operators=("+",), operand_hi=100, exact="top:64", pairs_per_op=200)
    ask = ExecutionConfig(patch_chunk=256)
    layers = 24
    full = request_memory(shape, config, ask, layers).host_peak
    smallest = request_memory(shape, config, replace(ask, patch_chunk=1, activation_budget=0),
                              layers).host_peak
    assert smallest < full - 0.5 * GIB  # the chunk and the activations matter here
    order = [(c, True) for c in (256, 128, 64, 32, 16)] + [
        (c, False) for c in (256, 128, 64, 32, 16, 8, 4, 2, 1)]
    need = {(c, keep): request_memory(
        shape, config, replace(ask, patch_chunk=c, activation_budget=(
            ask.activation_budget if keep else 0)), layers).host_peak for c, keep in order}
    chosen = set()
    for budget in np.linspace(smallest, full + GIB, 12):
        fitted = fit_request(shape, config, replace(ask, memory_budget=int(budget)), layers,
                             "the test")
        got = (fitted.execution.patch_chunk, fitted.execution.activation_budget > 0)
        assert fitted.estimate.host_peak <= budget
        first = next(i for i, key in enumerate(order) if need[key] <= budget)
        assert got == order[first], (budget / GIB, got)
        chosen.add(got)
        assert (fitted.note is None) == (first == 0)
        if fitted.note and got[0] != 256:
            assert f"patch chunk 256 -> {got[0]}" in fitted.note
        elif fitted.note:
            assert "patch chunk" not in fitted.note
            assert "each layer's grid computed when the layer runs" in fitted.note
    assert len(chosen) >= 5, chosen  # the budgets reach settings of both kinds
    assert {keep for _, keep in chosen} == {True, False}
    with pytest.raises(MemoryBudgetError, match=f"needs about {smallest / GIB:.2f} GiB"):
        fit_request(shape, config, replace(ask, memory_budget=int(smallest) - 1), layers,
                    "the test")


def test_footprints_count_the_parameters_transformerlens_loads(pythia_hub, tiny_builtin,
                                                                monkeypatch):
    from catalog.builtin import model_name
    from catalog.sources import inspect_model, load_model

    cfg, root = tiny_builtin
    for name, kwargs in ((pythia_hub, {}), (model_name(cfg), {"cache_root": root})):
        step = 1000 if name == pythia_hub else None
        fp = inspect_model(name, step, **kwargs).footprint
        lm = load_model(name, step, progress=False, **kwargs)
        loaded = sum(p.numel() for p in lm.model.parameters())
        # TransformerLens folds the LayerNorms' weights and biases away: a few thousand
        assert 0 <= fp.n_params - loaded <= 0.01 * loaded, (name, fp, loaded)
        assert (fp.n_layers, fp.d_mlp, fp.d_model) == (
            lm.model.cfg.n_layers, lm.model.cfg.d_mlp, lm.model.cfg.d_model)


def _ncat(args, env, code="") -> subprocess.CompletedProcess:
    """``ncat ARGS`` in a child that prints its own peak resident bytes on its last line:
    the kernel's high-water mark of its address space (VmHWM), which starts afresh at
    exec (getrusage's ru_maxrss does not: it kept the forking pytest worker's 650 MiB)."""
    script = ("import re, sys\nfrom jobs.cli import main\n"
              f"rc = main({args!r})\n"
              "kib = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1]\n"
              "print(int(kib) * 1024)\n"
              "sys.exit(rc)\n")
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_a_tiny_measure_stays_within_its_budget_sized_down_or_is_refused_before_loading(
        tiny_builtin):
    from catalog.builtin import model_name
    from catalog.sources import inspect_model

    cfg, root = tiny_builtin
    name = model_name(cfg)
    args = ["measure", name, "--ops", "+-", "--hi", "40", "--exact", "top:16", "--quiet"]
    config = ScienceConfig(operators=("+", "-"), operand_hi=40, exact="top:16")
    shape = inspect_model(name, None, cache_root=root)
    est = request_memory(shape, config, ExecutionConfig(), shape.n_layers)
    env = {**os.environ, "NCAT_HOME": str(root.parent)}
    env.pop("NCAT_MEMORY_BUDGET", None)
    ran = _ncat(args, env)
    assert ran.returncode == 0, ran.stderr[-2000:]
    peak = int(ran.stdout.strip().splitlines()[-1])
    print(f"tiny measure: peak {peak / 2**20:.0f} MiB, estimated {est.host_peak / 2**20:.0f}")
    assert peak <= est.host_peak
    # a budget just under the estimate: the run is sized down to fit it (a smaller patch
    # chunk), says so, and stays within it
    tight = int(est.host_peak) - 1
    sized = _ncat(args, {**env, "NCAT_MEMORY_BUDGET": str(tight)})
    assert sized.returncode == 0, sized.stderr[-2000:]
    assert "patch chunk 64 -> 32, every layer's grid activations kept" in sized.stderr
    assert int(sized.stdout.strip().splitlines()[-1]) <= tight
    # under the smallest setting's need: refused with exit 2, before loading (the model
    # is never read: its checkpoint folder is not even listed again)
    smallest = request_memory(shape, config, ExecutionConfig(patch_chunk=1,
                                                             activation_budget=0),
                              shape.n_layers)
    small = {**env, "NCAT_MEMORY_BUDGET": str(int(smallest.host_peak) - 1)}
    refused = _ncat(args, small)
    assert refused.returncode == 2, refused.stderr[-2000:]
    err = refused.stderr
    assert f"needs about {smallest.host_peak / GIB:.2f} GiB" in err
    assert "(NCAT_MEMORY_BUDGET); nothing was loaded" in err
    assert "host peak" in err
    # the refusal happens before loading: its own peak is the bare process's
    assert int(refused.stdout.strip().splitlines()[-1]) < peak


def test_plan_and_measure_refuse_before_loading(tiny_builtin, monkeypatch, tmp_path):
    """load_model is never reached: both commands check the budget first."""
    import catalog.sources
    from catalog.builtin import model_name
    from jobs.cli import main
    from jobs.plan import plan_request

    cfg, root = tiny_builtin
    monkeypatch.setenv("NCAT_HOME", str(root.parent))
    monkeypatch.setenv("NCAT_MEMORY_BUDGET", "1M")

    def no_load(*a, **k):
        raise AssertionError("loaded a model over the budget")
    monkeypatch.setattr(catalog.sources, "load_model", no_load)
    assert main(["measure", model_name(cfg), "--hi", "20", "--quiet"]) == 2
    with pytest.raises(MemoryBudgetError, match="budget of 0.00 GiB"):
        plan_request("postgresql://unused@localhost:1/none", model_name(cfg), None,
                     ScienceConfig(operand_hi=20), home=tmp_path)
    # the flag wins over the environment: with a budget of 1 TiB the command goes on to
    # load the model (here, the stand-in that fails)
    with pytest.raises(AssertionError, match="loaded a model over the budget"):
        main(["measure", model_name(cfg), "--hi", "20", "--quiet",
              "--memory-budget", str(1 << 40)])


FRAGMENT = """
import re, sys, torch
from catalog.measuring.memory import freed_memory_returned

def rss():
    return int(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read())[1]) * 1024

def fragment():
    torch.ones(1024**2)  # a 4 MiB block freed: glibc's threshold rises past the rest
    blocks = [torch.ones(1024**2) for _ in range(100)]  # 400 MiB, written
    before = rss()
    del blocks[::2]  # every other block: holes between live ones
    return before - rss()

if sys.argv[1] == "inside":
    with freed_memory_returned():
        print(fragment())
else:
    print(fragment())
"""


@pytest.mark.skipif(_glibc() is None or not Path("/proc/self/status").exists(),
                    reason="glibc's allocator and /proc only")
def test_tensors_freed_while_loading_go_back_to_the_system():
    """Half of 100 blocks of 4 MiB freed, every other one: outside the loader's context
    glibc keeps the holes (its threshold has risen past 4 MiB, so they came from the
    heap); inside it they are returned (each came from its own mapping)."""
    returned = {}
    for where in ("inside", "outside"):
        ran = subprocess.run([sys.executable, "-c", FRAGMENT, where], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
        assert ran.returncode == 0, ran.stderr[-2000:]
        returned[where] = int(ran.stdout.split()[-1]) / 1024**2
    print(returned)
    assert returned["inside"] >= 190  # of the 200 MiB freed
    assert returned["outside"] <= 20
