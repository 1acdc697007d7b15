"""Peak resident memory of loading a model, against its weights in the working dtype.

    .venv/bin/python bench/load_memory.py MODEL [--dtype bfloat16] [--runs 3] [--whole]
    .venv/bin/python bench/load_memory.py --random-shape qwen2.5-1.5b [...]
    .venv/bin/python bench/load_memory.py --random-folder [...]

``--random-shape`` writes a random model of a real model's shape into a temporary GGUF
file (Q8_0 matrices; the writer of the tests, ``tests/offline_models.write_gguf``) and
measures that: the shapes of models too large to fetch here. ``--random-folder`` does
the same for a Hugging Face folder of safetensors (``random_folder``).

Each run is a fresh process (a model loaded twice in one process would measure the
allocator's leftovers): it imports everything, resets the kernel's high-water mark of its
resident set, runs ``catalog.sources.load_model``, and reports that mark over the resident
set just before loading (the process), next to the loaded model's weights in
their dtype (TransformerLens's parameters, unembedding untied). Issue 33's target: a peak
at most 1.5x the weights over the process. Prints one JSON line per run, then the median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GIB = 1024**3


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _reset_high_water_mark() -> None:
    """Set VmHWM to the resident set now (Linux: "5" to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # then the high-water mark since the process began: at least as large


def _high_water_mark() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def one_run(model: str, dtype: str, whole: bool = False) -> dict:
    """In this process: load ``model`` in ``dtype`` and measure (see the module's doc);
    ``whole``: loaded whole by transformers, as before streaming."""
    import torch

    from catalog.sources import load_model, streaming

    if whole:  # every file falls back to transformers' whole load
        streaming.GGUFTensors._ONE_TO_ONE = ()

        def refuse(self, *args):
            raise streaming.StreamUnsupported("--whole")

        streaming.SafetensorsTensors.__init__ = refuse  # type: ignore[method-assign]

    _reset_high_water_mark()
    before = _rss()
    t0 = time.perf_counter()
    lm = load_model(model, dtype=getattr(torch, dtype), progress=False)
    seconds = time.perf_counter() - t0
    # the kernel's high-water mark of the resident set (VmHWM), reset just before: no
    # sampling thread to miss a peak or to change the allocator's arenas. Not
    # getrusage's ru_maxrss: it survives fork and exec, so a child of a large process
    # (pytest) reports its parent's size
    peak = _high_water_mark()
    weights = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    peak_over = peak - before
    return {"model": model, "dtype": dtype, "whole_file": whole, "weights_gib": weights / GIB,
            "process_gib": before / GIB, "peak_over_process_gib": peak_over / GIB,
            "after_over_process_gib": (_rss() - before) / GIB,
            "peak_over_weights": peak_over / weights, "load_s": seconds,
            "weights_hash": lm.info.weights_hash}


# real models' shapes (their configs), for --random-shape
SHAPES = {
    "qwen2.5-1.5b": dict(arch="qwen2", d=1536, n_layers=28, d_ff=8960, n_heads=12,
                         n_kv_heads=2, n_vocab=151_936, tied=True),
    "qwen2.5-0.5b": dict(arch="qwen2", d=896, n_layers=24, d_ff=4864, n_heads=14,
                         n_kv_heads=2, n_vocab=151_936, tied=True),
}


def random_model(shape: str, folder: Path) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from offline_models import write_gguf

    return write_gguf(folder / f"random-{shape}.gguf", quantized=True, norm_scale=0.1,
                      **SHAPES[shape])


def random_folder(folder: Path) -> Path:
    """A random Qwen 2 (16 layers, d_model 1,024, d_mlp 4,096, 32,000 tokens, untied; 1.15
    GiB in float32) saved as a Hugging Face folder (one safetensors file)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from offline_models import number_tokenizer

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=32_000, hidden_size=1024, intermediate_size=4096, num_hidden_layers=16,
        num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=512,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=1))
    out = folder / "random-qwen2-folder"
    model.save_pretrained(out)
    number_tokenizer().save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?")
    parser.add_argument("--random-shape", choices=sorted(SHAPES))
    parser.add_argument("--random-folder", action="store_true",
                        help="a random Qwen 2 saved as a safetensors folder (1.15 GiB)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--whole", action="store_true",
                        help="load a GGUF file whole (the fallback; as before streaming)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_run(args.model, args.dtype, args.whole)))
        return
    if (args.model is not None) + bool(args.random_shape) + args.random_folder != 1:
        parser.error("give one of MODEL, --random-shape, --random-folder")
    with tempfile.TemporaryDirectory() as tmp:
        if args.random_shape:
            args.model = str(random_model(args.random_shape, Path(tmp)))
        if args.random_folder:
            args.model = str(random_folder(Path(tmp)))
        _runs(args)


def _runs(args) -> None:
    rows = []
    for _ in range(args.runs):
        out = subprocess.run([sys.executable, __file__, args.model, "--dtype", args.dtype,
                              "--child"] + (["--whole"] if args.whole else []), check=True,
                             capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    ratios = [r["peak_over_weights"] for r in rows]
    print(json.dumps({"median_peak_over_weights": statistics.median(ratios),
                      "min": min(ratios), "max": max(ratios),
                      "median_peak_over_process_gib": statistics.median(
                          r["peak_over_process_gib"] for r in rows),
                      "median_load_s": statistics.median(r["load_s"] for r in rows),
                      "runs": len(rows)}))


if __name__ == "__main__":
    main()
