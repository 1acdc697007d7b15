"""Model sources: built-in checkpoints, the offline Pythia cache, local HF dirs, GGUF, errors."""

import json
from pathlib import Path

import pytest
import torch

from catalog.sources import ModelSourceError, list_checkpoints, load_model

from offline_models import write_llama_gguf, write_local_model


def test_builtin_checkpoints_load_with_distinct_hashes(tiny_builtin):
    cfg, root = tiny_builtin
    steps = list_checkpoints("builtin", builtin_config=cfg, cache_root=root)
    assert steps == cfg.checkpoint_steps() == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 300]
    first = load_model("builtin", 0, builtin_config=cfg, cache_root=root)
    last = load_model("builtin", builtin_config=cfg, cache_root=root)
    assert last.info.checkpoint == 300 and last.info.revision == "step300"
    assert first.info.weights_hash != last.info.weights_hash
    assert (last.info.n_layers, last.info.d_mlp, last.info.number_limit) == (2, 64, 999)
    # the recorded hash is the hash of the saved raw weights
    meta = json.loads((root / cfg.key() / "step300.json").read_text())
    assert meta["weights_hash"] == last.info.weights_hash


def test_builtin_missing_and_broken_checkpoints(tiny_builtin, tmp_path):
    cfg, root = tiny_builtin
    with pytest.raises(ModelSourceError, match=r"step 5 not found.*available steps: \[0, 1, 2"):
        load_model("builtin", 5, builtin_config=cfg, cache_root=root)
    broken = tmp_path / cfg.key()
    broken.mkdir()
    (broken / "step3.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ModelSourceError, match="step3.pt cannot be read"):
        load_model("builtin", 3, builtin_config=cfg, cache_root=tmp_path)
    with pytest.raises(ModelSourceError, match="no checkpoints yet"):
        load_model("builtin", builtin_config=cfg, cache_root=tmp_path / "empty")


def test_pythia_revisions_from_offline_cache(pythia_hub):
    a = load_model(pythia_hub, checkpoint=1000)
    b = load_model(pythia_hub, checkpoint=2000)
    assert a.info.source == "hub" and a.info.revision == "step1000"
    assert a.info.weights_hash != b.info.weights_hash
    assert (a.info.n_layers, a.info.d_model, a.info.d_mlp) == (6, 128, 512)
    assert a.model.cfg.rotary_dim == 8  # rotary 0.25 of d_head 32
    assert a.info.number_limit == 520 and not a.info.digit_level
    again = load_model(pythia_hub, checkpoint=1000)
    assert again.info.weights_hash == a.info.weights_hash
    # offline (the tests set HF_HUB_OFFLINE), the steps are those the cache holds
    assert list_checkpoints(pythia_hub) == [1000, 2000]


def test_pythia_bad_checkpoints_name_what_exists(pythia_hub):
    with pytest.raises(ModelSourceError, match=r"step 1500 does not exist.*\[.*1000, 2000"):
        load_model(pythia_hub, checkpoint=1500)
    # published, but not in the offline cache: the message lists what is cached
    with pytest.raises(ModelSourceError, match=r"step 3000 .* not in the offline .*cached "
                                               r"steps: \[1000, 2000\]"):
        load_model(pythia_hub, checkpoint=3000)


def test_a_cache_holding_only_step_revisions_loads_offline(pythia_hub):
    """A cache with refs/stepN and no refs/main used to fail with a bare OSError (the
    converter read the config and tokenizer at main)."""
    from huggingface_hub import constants

    main = Path(constants.HF_HUB_CACHE) / f"models--{pythia_hub.replace('/', '--')}" / \
        "refs" / "main"
    saved = main.read_text()
    main.unlink()
    try:
        lm = load_model(pythia_hub, checkpoint=1000)
        assert lm.info.revision == "step1000" and lm.info.n_layers == 6
        assert list_checkpoints(pythia_hub) == [1000, 2000]
    finally:
        main.write_text(saved)


def test_steps_are_read_from_branch_names():
    from catalog.sources.hub import step_revisions

    names = ["main", "step20000", "step1000-tokens4B", "stage1-step0-tokens0B",
             "stage2-ingredient2-step500-tokens5B", "stage1-step500-tokens1B",
             "stage2-ingredient1-step700-tokens3B", "mystep12", "fix-steps"]
    assert step_revisions(names) == {
        0: "stage1-step0-tokens0B", 500: "stage1-step500-tokens1B",
        700: "stage2-ingredient1-step700-tokens3B", 1000: "step1000-tokens4B",
        20000: "step20000"}


def test_olmo_checkpoints_are_listed_from_branch_names_and_load_offline():
    """OLMo publishes its training checkpoints as branches named by stage, step and tokens;
    TransformerLens knows no labels for them. Offline, the cached branches give the steps,
    a step loads the main run's branch (stage 1, not a later stage counting its own steps),
    and the model is read from its own config (a tiny OLMo 2, not the hub name's shape)."""
    from huggingface_hub import constants

    from offline_models import OLMO2_REPO, write_olmo2_cache

    write_olmo2_cache(Path(constants.HF_HUB_CACHE), [
        "stage1-step1000-tokens3B", "stage1-step2000-tokens5B",
        "stage2-ingredient1-step1000-tokens2B"])
    assert list_checkpoints(OLMO2_REPO) == [1000, 2000]
    a = load_model(OLMO2_REPO, checkpoint=1000)
    assert a.info.revision == "stage1-step1000-tokens3B" and a.info.checkpoint == 1000
    assert a.model.cfg.original_architecture == "Olmo2ForCausalLM" and a.info.d_model == 64
    b = load_model(OLMO2_REPO, checkpoint=2000)
    main = load_model(OLMO2_REPO)  # refs/main: the stage-2 branch
    assert len({a.info.weights_hash, b.info.weights_hash, main.info.weights_hash}) == 3
    with pytest.raises(ModelSourceError, match=r"step 1500 does not exist.*\[1000, 2000\]"):
        load_model(OLMO2_REPO, checkpoint=1500)


def test_local_directory_and_gguf(tmp_path):
    local = load_model(str(write_local_model(tmp_path / "model", seed=3)))
    assert local.info.source == "local" and local.info.n_layers == 6
    gguf = load_model(str(write_llama_gguf(tmp_path / "tiny.gguf")))
    assert gguf.info.source == "gguf" and gguf.info.gated_mlp
    assert gguf.info.digit_level and gguf.info.number_limit == 9
    assert (gguf.info.n_layers, gguf.info.d_model, gguf.info.d_mlp) == (2, 64, 128)
    tokens = torch.tensor([[1, 5, 6, 14, 7]])
    logits = gguf.model(tokens)
    assert logits.shape == (1, 5, gguf.info.d_vocab)
    # the converted model predicts what transformers' own model of the file predicts: the
    # same distributions (the unembedding is centred, so logits move by a constant)
    from transformers import AutoModelForCausalLM

    path = tmp_path / "tiny.gguf"
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name,
                                              dtype=torch.float32)
    with torch.no_grad():
        want = hf(tokens).logits.log_softmax(-1)
    assert torch.allclose(logits.log_softmax(-1), want, atol=1e-4)


@pytest.mark.parametrize("name, checkpoint, message", [
    ("no-such-model-anywhere", None, "unknown model 'no-such-model-anywhere'"),
    ("./missing/dir", None, "path './missing/dir' does not exist"),
    ("/nowhere/model.gguf", None, "does not exist"),
    ("", None, "model name is empty"),
    ("gpt2", 100, "has no training checkpoints"),
])
def test_bad_names_and_paths(name, checkpoint, message):
    with pytest.raises(ModelSourceError, match=message):
        load_model(name, checkpoint)


def test_directory_without_config_and_checkpoint_on_local(tmp_path):
    with pytest.raises(ModelSourceError, match="not a Hugging Face model"):
        load_model(str(tmp_path))
    path = write_local_model(tmp_path / "m")
    with pytest.raises(ModelSourceError, match="has no training checkpoints"):
        load_model(str(path), checkpoint=10)


def test_gguf_and_known_models_are_inspected_without_loading_weights(tmp_path, monkeypatch):
    """Validation (ncat enqueue) reads a GGUF file's metadata and tokenizer only."""
    import dataclasses

    import catalog.sources as sources
    from catalog.sources import ModelSourceError, inspect_model, registry

    path = write_llama_gguf(tmp_path / "tiny.gguf")

    def no_load(*args, **kwargs):
        raise AssertionError("inspect loaded the weights")

    # the registered sources' loaders: what load_model would call
    for name in ("gguf", "known"):
        monkeypatch.setitem(sources.SOURCES, name,
                            dataclasses.replace(sources.SOURCES[name], load=no_load))
    shape = inspect_model(str(path))
    assert shape.n_layers == 2 and shape.numbers.digit_level
    # a known model: not fetched yet is a clear error naming the fetch command
    monkeypatch.setenv("NCAT_HOME", str(tmp_path / "home"))
    with pytest.raises(ModelSourceError, match="ncat fetch qwen2.5-coder-0.5b"):
        inspect_model("qwen2.5-coder-0.5b")
    # once its file is in place it is inspected from that file, by name
    known = registry.KNOWN["qwen2.5-coder-0.5b"].path(tmp_path / "home")
    known.parent.mkdir(parents=True)
    known.symlink_to(path)
    assert inspect_model("qwen2.5-coder-0.5b").n_layers == 2
    with pytest.raises(ModelSourceError, match="no training checkpoints"):
        inspect_model("qwen2.5-coder-0.5b", 1000)


def test_a_truncated_safetensors_file_is_refused_before_anything_is_queued(tmp_path):
    """`enqueue` used to accept a directory whose weights `measure` then refused: the
    inspection reads only config and tokenizer. It now checks each safetensors file
    against its own header (and an index's shards exist), without loading weights."""
    from catalog.sources import inspect_model

    path = write_local_model(tmp_path / "m", seed=1)
    assert inspect_model(str(path)).n_layers == 6  # whole: accepted
    weights = next(path.glob("*.safetensors"))
    data = weights.read_bytes()
    weights.write_bytes(data[:-1000])
    with pytest.raises(ModelSourceError, match="truncated"):
        inspect_model(str(path))
    weights.write_bytes(data[:4])
    with pytest.raises(ModelSourceError, match="truncated"):
        inspect_model(str(path))
    weights.write_bytes(data)
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"x": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(ModelSourceError, match="missing: model-00002-of-00002"):
        inspect_model(str(path))


def test_padded_number_tokenizer_keeps_the_numbers_and_reaches_the_size():
    from offline_models import PYTHIA_VOCAB, number_tokenizer

    plain, padded = number_tokenizer(), number_tokenizer(pad_to=PYTHIA_VOCAB)
    assert len(padded) == PYTHIA_VOCAB
    for text in ("12+345=", "999*7=", "Q: 40 / 8?"):
        assert padded.encode(text) == plain.encode(text)
    with pytest.raises(ValueError, match="pad_to"):
        number_tokenizer(pad_to=10)


def _save_random(model_cls, config, path: Path) -> Path:
    from offline_models import number_tokenizer

    torch.manual_seed(0)
    model_cls(config).save_pretrained(path)
    number_tokenizer().save_pretrained(path)
    return path


def _gpt2(vocab):
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel, GPT2Config(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4,
                                       n_positions=64, bos_token_id=0, eos_token_id=0)


def _llama(vocab):
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM, LlamaConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         intermediate_size=128, max_position_embeddings=64)


@pytest.mark.parametrize("folder, build, d_mlp", [
    # recent transformers saves GPT-2 with n_positions and no n_ctx, which
    # TransformerLens 3.x reads (the hub's gpt2 config.json has both): AttributeError
    ("gpt2", _gpt2, 256),
    # a folder named after its model: TransformerLens took "llama" in the path for an
    # official name and read no config ('NoneType' object has no attribute 'hidden_size')
    ("Llama-3.2-tiny", _llama, 128),
])
def test_local_directories_load_and_predict_as_the_hf_model_does(tmp_path, folder, build, d_mlp):
    """Local Hugging Face directories that crashed the conversion load, and the converted
    model's next-token log-probabilities equal the Hugging Face model's (weight
    processing shifts logits by a constant per position, which log-softmax removes)."""
    from offline_models import number_tokenizer

    model_cls, config = build(len(number_tokenizer()))
    path = _save_random(model_cls, config, tmp_path / folder)
    lm = load_model(str(path))
    assert (lm.info.n_layers, lm.info.d_model, lm.info.d_mlp) == (2, 64, d_mlp)
    hf = model_cls.from_pretrained(path).eval()
    tokens = lm.tokenizer("17+25=", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        ours = torch.log_softmax(lm.model(tokens)[0, -1].double(), -1)
        theirs = torch.log_softmax(hf(tokens).logits[0, -1].double(), -1)
    assert torch.allclose(ours, theirs, atol=1e-4), (ours - theirs).abs().max()


def test_an_architecture_transformer_lens_cannot_convert_is_named(tmp_path):
    """A causal LM that transformers loads but TransformerLens cannot convert gives a
    ModelSourceError naming the architecture and the directory, not a traceback (so do
    Phi-1/2 directories saved by transformers 5, checked by hand)."""
    from transformers import FalconConfig, FalconForCausalLM

    from offline_models import number_tokenizer

    config = FalconConfig(vocab_size=len(number_tokenizer()), hidden_size=32,
                          num_hidden_layers=1, num_attention_heads=4)
    path = _save_random(FalconForCausalLM, config, tmp_path / "falcon")
    with pytest.raises(ModelSourceError, match=r"FalconForCausalLM.*falcon.*not currently"):
        load_model(str(path))


def test_linear_weights_are_laid_out_so_that_no_forward_copies_them(tmp_path):
    """TransformerLens 3.9 multiplies the unembedding and a gated MLP's matrices as
    ``F.linear(x, W.T.contiguous())``; loaded models store them so that this is no copy,
    and their logits are bitwise those of the usual layout."""
    from catalog.sources import load_model

    from offline_models import write_llama_gguf

    lm = load_model(str(write_llama_gguf(tmp_path / "tiny.gguf")))
    model = lm.model
    mats = [model.unembed.W_U] + [getattr(b.mlp, n) for b in model.blocks
                                  for n in ("W_gate", "W_in", "W_out")]
    assert all(w.T.contiguous().data_ptr() == w.data_ptr() for w in mats)
    toks = torch.tensor([[1, 5, 9, 12, 7, 3]])
    with torch.no_grad():
        fast = model(toks)
        for w in mats:  # back to the usual layout: every forward copies again
            w.data = w.data.contiguous()
        assert not model.unembed.W_U.T.is_contiguous()
        usual = model(toks)
    assert torch.equal(fast, usual)


def test_quiet_loads_draw_no_loader_bars(tmp_path, capfd):
    """`--quiet` (``progress=False``): transformers' GGUF and weight-loading bars, drawn on
    stderr, stay off; by default they are shown."""
    path = str(write_llama_gguf(tmp_path / "tiny.gguf"))
    capfd.readouterr()
    load_model(path)
    assert "GGUF tensors" in capfd.readouterr().err
    load_model(path, progress=False)
    assert "GGUF tensors" not in capfd.readouterr().err


def test_a_gguf_that_cannot_be_converted_is_refused_before_its_weights_are_read(
        tmp_path, monkeypatch):
    """The architecture is in the GGUF's metadata: a model TransformerLens cannot convert
    is refused from it, naming the architecture, and no weight is dequantized (a Gemma-3
    file was refused only after 86 s of loading)."""
    import transformers
    from transformer_lens import loading_from_pretrained as tl_loading

    path = str(write_llama_gguf(tmp_path / "tiny.gguf"))

    def no_weights(*args, **kwargs):
        raise AssertionError("the weights were read")

    def refuse(*args, **kwargs):
        raise NotImplementedError("LlamaForCausalLM is not currently supported")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    monkeypatch.setattr(tl_loading, "get_pretrained_model_config", refuse)
    with pytest.raises(ModelSourceError, match=r"cannot convert the LlamaForCausalLM model"):
        load_model(path)
