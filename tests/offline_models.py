"""Offline stand-ins for hub models, so the real loading paths run without internet.

Model hubs are unreachable on many research and CI machines. These builders
write small, randomly initialised models in exactly the formats real users load:

- ``write_pythia_cache``: a GPT-NeoX model with Pythia-14m's shape (6 layers,
  d_model 128, 4 heads, d_mlp 512, rotary 0.25, parallel residual), saved with
  ``save_pretrained`` at several training steps into a Hugging Face cache layout
  (``models--EleutherAI--pythia-14m/refs/step{N}`` -> ``snapshots/<hash>/``), so
  ``load_model("EleutherAI/pythia-14m", checkpoint=N)`` with ``HF_HUB_OFFLINE=1``
  takes the same code path as an online user;
- ``write_local_model``: a Hugging Face model directory;
- ``write_llama_gguf`` (``write_gguf`` for other shapes, Qwen 2, tied or Q8_0 weights):
  a tiny Llama in a GGUF file whose SentencePiece-style
  tokenizer splits numbers into single digits (like Llama 2 or Mistral).

Their tokenizers are built with the ``tokenizers`` library: numbers up to a limit
(Pythia: about 520) are single tokens, as in the real vocabularies.
"""

from __future__ import annotations

import hashlib
import string
from pathlib import Path

import numpy as np
import torch
from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import Unigram
from transformers import PreTrainedTokenizerFast

PYTHIA_REPO = "EleutherAI/pythia-14m"
PYTHIA_SINGLE_TOKEN_LIMIT = 520


def number_tokenizer(limit: int = PYTHIA_SINGLE_TOKEN_LIMIT,
                     pad_to: int | None = None) -> PreTrainedTokenizerFast:
    """A tokenizer with one token per integer 0..limit and per printable character.

    Longer numbers split into the fewest known pieces ("999" -> "9", "99"), as BPE
    vocabularies like Pythia's do. BOS/EOS is ``<|endoftext|>`` (id 0). ``pad_to``
    adds filler tokens (never produced from text) up to that vocabulary size, so the
    unembedding and the full-vocabulary softmax cost what a real vocabulary's do.
    """
    specials = ["<|endoftext|>", "<|padding|>"]
    chars = [c for c in string.printable if c not in string.digits and c not in "\t\n\r\x0b\x0c"]
    vocab = [(t, 0.0) for t in specials]
    vocab += [(str(n), -1.0) for n in range(limit + 1)] + [(c, -1.0) for c in chars]
    if pad_to is not None:
        if pad_to < len(vocab):
            raise ValueError(f"pad_to={pad_to} is below the {len(vocab)} tokens needed")
        vocab += [(f"<|filler{i}|>", -100.0) for i in range(pad_to - len(vocab))]
    tok = Tokenizer(Unigram(vocab, unk_id=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\d+|\D"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
        pad_token="<|padding|>",
    )


PYTHIA_14M_SHAPE = dict(hidden_size=128, num_hidden_layers=6, num_attention_heads=4,
                        intermediate_size=512)
# the published Pythia shapes (config.json of EleutherAI/pythia-*); vocabulary 50,304
PYTHIA_SHAPES = {
    "14m": PYTHIA_14M_SHAPE,
    "70m": dict(hidden_size=512, num_hidden_layers=6, num_attention_heads=8,
                intermediate_size=2048),
    "160m": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072),
    "410m": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                 intermediate_size=4096),
    "1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=8,
               intermediate_size=8192),
    "1.4b": dict(hidden_size=2048, num_hidden_layers=24, num_attention_heads=16,
                 intermediate_size=8192),
}
PYTHIA_VOCAB = 50_304


def pythia_like_config(vocab_size: int, shape: dict | None = None):
    """GPT-NeoX config with Pythia's architecture and Pythia-14m's shape (or ``shape``:
    hidden_size, num_hidden_layers, num_attention_heads, intermediate_size)."""
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(
        vocab_size=vocab_size, **(shape or PYTHIA_14M_SHAPE), rotary_pct=0.25,
        rotary_emb_base=10000, use_parallel_residual=True, max_position_embeddings=2048,
        hidden_act="gelu", layer_norm_eps=1e-5, bos_token_id=0, eos_token_id=0,
        tie_word_embeddings=False,
    )


def write_local_model(path: Path, seed: int = 0, tokenizer=None,
                      shape: dict | None = None) -> Path:
    """Save a randomly initialised Pythia-like model and its tokenizer to ``path``."""
    from transformers import GPTNeoXForCausalLM

    tokenizer = tokenizer or number_tokenizer()
    torch.manual_seed(seed)
    model = GPTNeoXForCausalLM(pythia_like_config(len(tokenizer), shape))
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def pythia_shaped(shape: str, device: str = "cpu", seed: int = 0):
    """(HookedTransformer, tokenizer): a randomly initialised model with a published
    Pythia shape and Pythia's vocabulary size, built in memory and converted with full
    weight processing like a loaded checkpoint (nothing is written to disk)."""
    import tempfile

    from transformers import AutoTokenizer, GPTNeoXForCausalLM

    from catalog.sources import from_hf_model

    tokenizer = number_tokenizer(pad_to=PYTHIA_VOCAB)
    config = pythia_like_config(len(tokenizer), PYTHIA_SHAPES[shape])
    torch.manual_seed(seed)
    hf_model = GPTNeoXForCausalLM(config)  # on the CPU, where TransformerLens processes it
    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)  # TransformerLens reloads it by its path
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = from_hf_model(hf_model, tokenizer, f"random Pythia-{shape} shape", device,
                               torch.float32)
    del hf_model
    return model, tokenizer


def write_pythia_cache(hub_cache: Path, steps: list[int], repo: str = PYTHIA_REPO,
                       shape: dict | None = None) -> Path:
    """Write ``repo`` at each step as a Hugging Face cache entry; refs/main is the last step.

    ``hub_cache`` is what ``HF_HUB_CACHE`` points at. Each step gets its own seed, so
    the weights (and their hashes) differ per step. ``shape`` overrides Pythia-14m's
    (a small stand-in keeps a many-checkpoint test quick).
    """
    folder = hub_cache / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    for step in steps:
        commit = hashlib.sha1(f"{repo}@step{step}".encode()).hexdigest()
        write_local_model(folder / "snapshots" / commit, seed=step, shape=shape)
        (folder / "refs" / f"step{step}").write_text(commit)
    (folder / "refs" / "main").write_text((folder / "refs" / f"step{max(steps)}").read_text())
    return folder


def write_llama_gguf(path: Path, seed: int = 0) -> Path:
    """A tiny random Llama (2 layers, d_model 64, d_mlp 128) in GGUF, digit-level tokenizer."""
    return write_gguf(path, seed=seed)


def write_gguf(path: Path, *, arch: str = "llama", seed: int = 0, d: int = 64,
               n_layers: int = 2, d_ff: int = 128, n_heads: int = 4, n_kv_heads: int = 4,
               extra_tokens: int = 0, tied: bool = False, quantized: bool = False,
               norm_scale: float = 0.0, n_vocab: int | None = None) -> Path:
    """A random decoder in GGUF with a digit-level SentencePiece-style vocabulary
    (``extra_tokens`` more tokens widen it): ``arch`` "llama" or "qwen2" (biases on Q, K,
    V); ``tied``: no output tensor (the head is the embedding); ``quantized``: the
    matrices in Q8_0, dequantized in blocks on load, as a real model's are; norm weights
    1 + ``norm_scale`` x N(0, 1) (ones by default, the weights the defaults always had);
    ``n_vocab``: pad the vocabulary to this size (a real model's shape)."""
    import gguf
    from gguf import GGMLQuantizationType, quants

    rng = np.random.default_rng(seed)
    specials = ["<unk>", "<s>", "</s>"]
    chars = ["\u2581"] + list(string.digits) + list("+-*/=:?.,") + list(string.ascii_letters)
    if n_vocab is not None:
        extra_tokens = n_vocab - len(specials) - len(chars)
    chars += [f"\u2581w{i}" for i in range(extra_tokens)]
    tokens = specials + chars
    n_vocab, d_head = len(tokens), d // n_heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(64)
    w.add_embedding_length(d)
    w.add_block_count(n_layers)
    w.add_feed_forward_length(d_ff)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv_heads)
    w.add_rope_dimension_count(d_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(specials) + [-float(i) for i in range(len(chars))])
    w.add_token_types([3, 3, 3] + [1] * len(chars))  # 3 = control, 1 = normal
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def add(name, *shape, scale=0.1, offset=0.0):
        x = (rng.standard_normal(shape) * scale + offset if scale else
             np.full(shape, offset)).astype(np.float32)
        if quantized and len(shape) == 2:
            w.add_tensor(name, quants.quantize(x, GGMLQuantizationType.Q8_0),
                         raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, x)

    add("token_embd.weight", n_vocab, d)
    for i in range(n_layers):
        add(f"blk.{i}.attn_norm.weight", d, scale=norm_scale, offset=1.0)
        add(f"blk.{i}.attn_q.weight", d, d)
        add(f"blk.{i}.attn_k.weight", n_kv_heads * d_head, d)
        add(f"blk.{i}.attn_v.weight", n_kv_heads * d_head, d)
        if arch == "qwen2":
            add(f"blk.{i}.attn_q.bias", d)
            add(f"blk.{i}.attn_k.bias", n_kv_heads * d_head)
            add(f"blk.{i}.attn_v.bias", n_kv_heads * d_head)
        add(f"blk.{i}.attn_output.weight", d, d)
        add(f"blk.{i}.ffn_norm.weight", d, scale=norm_scale, offset=1.0)
        add(f"blk.{i}.ffn_gate.weight", d_ff, d)
        add(f"blk.{i}.ffn_up.weight", d_ff, d)
        add(f"blk.{i}.ffn_down.weight", d, d_ff)
    add("output_norm.weight", d, scale=norm_scale, offset=1.0)
    if not tied:
        add("output.weight", n_vocab, d)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


OLMO2_REPO = "allenai/OLMo-2-0425-1B"


def write_olmo2_cache(hub_cache: Path, revisions: list[str], repo: str = OLMO2_REPO) -> Path:
    """Write a tiny random OLMo 2 at each branch name of ``revisions`` (OLMo's naming:
    ``stage1-step1000-tokens3B``) into a Hugging Face cache layout, one seed per branch;
    refs/main is the last. The shape is small (2 layers, width 64): the catalog reads the
    architecture from the config, not from TransformerLens's table for the hub name."""
    from transformers import Olmo2Config, Olmo2ForCausalLM

    tokenizer = number_tokenizer(limit=100)
    folder = hub_cache / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    for i, revision in enumerate(revisions):
        commit = hashlib.sha1(f"{repo}@{revision}".encode()).hexdigest()
        torch.manual_seed(i)
        model = Olmo2ForCausalLM(Olmo2Config(
            vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
            max_position_embeddings=512, pad_token_id=1, bos_token_id=0, eos_token_id=0))
        model.save_pretrained(folder / "snapshots" / commit)
        tokenizer.save_pretrained(folder / "snapshots" / commit)
        (folder / "refs" / revision).write_text(commit)
    (folder / "refs" / "main").write_text((folder / "refs" / revisions[-1]).read_text())
    return folder
