"""GGUF files loaded one tensor at a time (catalog.sources.streaming): the same model,
the same weights hash and the same check against transformers as a whole-file load, in
the working dtype, within 1.5x its weights."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from catalog.sources import ModelSourceError, load_model, streaming

from offline_models import write_gguf, write_llama_gguf

ROOT = Path(__file__).resolve().parents[2]

VARIANTS = {
    "llama": {},
    # grouped K/V heads, norms that fold into the next weights, Q8_0 blocks, tied head
    "llama-gqa-q8-tied": {"n_kv_heads": 2, "norm_scale": 0.2, "quantized": True,
                          "tied": True},
    "qwen2-biases": {"arch": "qwen2", "n_kv_heads": 2, "norm_scale": 0.2},
}


def _tokenizer(tmp_path):
    from transformers import AutoTokenizer

    path = write_llama_gguf(tmp_path / "tok.gguf")
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def _whole(monkeypatch):
    """Make every file unstreamable: the loader falls back to transformers' whole-file
    load."""
    monkeypatch.setattr(streaming.GGUFTensors, "_ONE_TO_ONE", ())

    def refuse(self, *args):
        raise streaming.StreamUnsupported("forced by the test")

    monkeypatch.setattr(streaming.SafetensorsTensors, "__init__", refuse)


def _same_model(streamed, whole, dtype):
    assert streamed.info == whole.info  # the weights hash (float32 source) included
    got, want = streamed.model.state_dict(), whole.model.state_dict()
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype, key
        assert torch.equal(got[key], value), key
    for name, param in streamed.model.named_parameters():
        assert param.dtype == dtype and not param.requires_grad, name


def _streamed_calls(monkeypatch) -> list:
    import catalog.sources.gguf as gguf_source

    calls: list = []
    real = gguf_source.load_streamed_or_none

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        if out is not None:  # streamed, not fallen back
            calls.append(out)
        return out

    monkeypatch.setattr(gguf_source, "load_streamed_or_none", spy)
    return calls


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_streamed_load_equals_the_whole_file_load(tmp_path, monkeypatch, variant, dtype):
    path = str(write_gguf(tmp_path / f"{variant}.gguf", seed=3, **VARIANTS[variant]))
    tok = _tokenizer(tmp_path)
    calls = _streamed_calls(monkeypatch)
    streamed = load_model(path, tokenizer=tok, dtype=dtype)
    assert len(calls) == 1  # it did stream
    with monkeypatch.context() as m:
        _whole(m)
        whole = load_model(path, tokenizer=tok, dtype=dtype)
    assert len(calls) == 1
    _same_model(streamed, whole, dtype)
    for name, param in streamed.model.named_parameters():
        if name == "unembed.W_U" or ".mlp.W_" in name:  # no copy per forward
            assert param.T.is_contiguous(), name
    tokens = torch.tensor([[1, 5, 6, 7, 8]])
    assert torch.equal(streamed.model(tokens), whole.model(tokens))


def _folder_streams(monkeypatch) -> list:
    calls: list = []
    real = streaming.SafetensorsTensors.__init__

    def spy(self, *args):
        real(self, *args)
        calls.append(args[0])

    monkeypatch.setattr(streaming.SafetensorsTensors, "__init__", spy)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_safetensors_folder_streams_equal_to_its_whole_load(tmp_path, monkeypatch, dtype,
                                                              pythia_hub):
    """A local folder (a Pythia-like GPT-NeoX: LayerNorm biases folded and centred) and a
    hub checkpoint from the offline cache, each read one tensor at a time: the same
    model and hash as transformers' whole load."""
    from catalog.sources import list_checkpoints

    from offline_models import write_local_model

    folder = str(write_local_model(tmp_path / "local", seed=4))
    for name, checkpoint in ((folder, None), (pythia_hub, list_checkpoints(pythia_hub)[-1])):
        calls = _folder_streams(monkeypatch)
        streamed = load_model(name, checkpoint, dtype=dtype)
        assert len(calls) == 1, name
        with monkeypatch.context() as m:
            _whole(m)
            whole = load_model(name, checkpoint, dtype=dtype)
        _same_model(streamed, whole, dtype)


def test_the_hash_is_the_whole_file_hash_in_every_dtype(tmp_path):
    path = str(write_gguf(tmp_path / "m.gguf", seed=5, quantized=True, norm_scale=0.1))
    hashes = {load_model(path, dtype=d).info.weights_hash
              for d in (torch.float32, torch.bfloat16, torch.float16)}
    assert len(hashes) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_conversion_that_misses_a_detail_is_refused_in_every_dtype(tmp_path, monkeypatch,
                                                                      dtype):
    """The check against transformers compares float32 logits, computed group by group
    before each group is cast: a bfloat16 load is checked as strictly as a float32 one
    (bfloat16 logits of Qwen2.5-Coder-0.5B differ from transformers' float32 ones by up to
    15 nats, so a check in the working dtype could not tell)."""
    from transformer_lens import loading_from_pretrained as tl_loading

    path = str(write_gguf(tmp_path / "m.gguf", seed=1, norm_scale=0.2))
    real = tl_loading.get_pretrained_state_dict

    def missing_a_detail(*args, **kwargs):  # a converter that drops layer 1's norm
        sd = real(*args, **kwargs)
        key = "blocks.1.ln2.w"
        if sd[key].device.type != "meta":
            sd[key] = torch.ones_like(sd[key])
        return sd

    monkeypatch.setattr(tl_loading, "get_pretrained_state_dict", missing_a_detail)
    calls = _streamed_calls(monkeypatch)
    with pytest.raises(ModelSourceError, match="disagrees with transformers"):
        load_model(path, dtype=dtype)
    assert calls == []  # refused by the streamed load's own check


def test_a_file_that_cannot_be_streamed_is_loaded_whole(tmp_path, monkeypatch, caplog):
    path = str(write_gguf(tmp_path / "m.gguf", seed=2))
    streamed = load_model(path, dtype=torch.bfloat16)
    _whole(monkeypatch)
    with caplog.at_level("INFO", logger="catalog.sources.streaming"):
        whole = load_model(path, dtype=torch.bfloat16)
    assert "is loaded whole" in caplog.text and "does not map one GGUF tensor" in caplog.text
    assert whole.info == streamed.info
    assert all(p.dtype == torch.bfloat16 for p in whole.model.parameters())


def _peak(path: Path, dtype: str, whole: bool) -> dict:
    """bench/load_memory.py's measure of one load, in a fresh process."""
    cmd = [sys.executable, "bench/load_memory.py", str(path), "--dtype", dtype, "--child"]
    out = subprocess.run(cmd + (["--whole"] if whole else []), cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_a_bfloat16_load_peaks_within_one_and_a_half_times_its_weights(tmp_path):
    """Peak resident memory of loading (the kernel's high-water mark, in a fresh process)
    over the process before loading: at most 1.5x the weights in bfloat16 and a fixed
    64 MiB (the tokenizer and the interpreter's growth), and under the plan's estimate,
    for a 98M-parameter model shaped like a real one (embeddings a quarter of it; 0.4 GB
    of float32 weights). The whole-file load, which dequantizes everything into float32
    first, does not fit the same bound: the test can fail."""
    from catalog.measuring.memory import PROCESS_BYTES, streamed_load
    from catalog.sources import inspect_model

    path = write_gguf(tmp_path / "big.gguf", seed=0, d=768, n_layers=8, d_ff=3072,
                      n_heads=12, extra_tokens=16_000, norm_scale=0.1)
    streamed = _peak(path, "bfloat16", whole=False)
    whole = _peak(path, "bfloat16", whole=True)
    weights = streamed["weights_gib"]
    assert weights == pytest.approx(whole["weights_gib"])
    bound = 1.5 * weights + 64 / 1024
    assert streamed["peak_over_process_gib"] <= bound, streamed
    assert whole["peak_over_process_gib"] > bound, whole
    assert streamed["weights_hash"] == whole["weights_hash"]
    footprint = inspect_model(str(path)).footprint
    assert footprint.source == "gguf-streamed"
    # the plan's host peak of loading: the process (with its margin) and the load
    planned = (PROCESS_BYTES + streamed_load(footprint, "bfloat16")) / 2**30
    assert streamed["process_gib"] + streamed["peak_over_process_gib"] <= planned
