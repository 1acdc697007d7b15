"""The direct contribution of every MLP neuron and attention head to one prompt's answer.

The final residual stream at the last position is a sum of what each component wrote:
the embeddings, each head's z_h W_O, each neuron's activation times its row of W_out, and
the biases. The target is the answer token's logit minus the mean logit of the competing
number tokens, before any final soft cap:

    T = norm_f(x) . d + b_U . d,   d = W_U[:, answer] - mean_c W_U[:, c].

A normalisation is linear once its scale is fixed (RMSNorm: w * x / s; LayerNorm:
w * (x - mean(x)) / s + b), so with the scale each norm had on this prompt frozen, T is
exactly the sum of one term per component: c . u with u = N^T d (N the frozen linear
part of the final norm, and of a block's output norm where the architecture has one:
Gemma 2 and 3 normalise each block's attention and MLP output, OLMo 2 normalises them
instead of the inputs). Each term is "what T would lose if this component's write were
removed and every norm kept its scale": its direct effect. Indirect effects (a neuron
that changes what later layers compute) are not in it; the prompt knockout measures
those (``catalog.explain.prompt``).

Computed in float64 from the float model's activations; the sum of the terms equals T to
the rounding of the model's own forward (tested in float64 to 1e-9 of |T|).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from transformer_lens import HookedTransformer
from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES

from catalog.measuring.grids import b_out, w_out


@dataclass
class Decomposition:
    """T and its terms at the last position of one prompt (float64).

    neurons: (n_layers, d_mlp) each neuron's term; heads: (n_layers, n_heads); embed: the
    embeddings' term; biases: every bias's term (b_O, b_out, the norms' b, b_U);
    activations: (n_layers, d_mlp) each neuron's activation here."""

    target: float
    neurons: np.ndarray
    heads: np.ndarray
    embed: float
    biases: float
    activations: np.ndarray
    logits: np.ndarray  # (d_vocab,) the model's logits at the last position (after any cap)

    @property
    def total(self) -> float:
        return float(self.neurons.sum() + self.heads.sum() + self.embed + self.biases)

    @property
    def error(self) -> float:
        """T minus the sum of the terms: the rounding of the model's forward."""
        return self.target - self.total


def _output_norms(model: HookedTransformer, layer: int) -> tuple:
    """(the norm of the attention's output, of the MLP's output) of a block, None where the
    block writes its output unnormalised."""
    block = model.blocks[layer]
    if model.cfg.use_normalization_before_and_after:
        return block.ln1_post, getattr(block, "ln2_post", None)
    if model.cfg.original_architecture in POST_NORM_ARCHITECTURES:
        return block.ln1, getattr(block, "ln2", None)
    return None, None


def hook_names(model: HookedTransformer) -> list[str]:
    """The hooks the decomposition reads (at the decomposed position)."""
    names = ["blocks.0.hook_resid_pre", f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]
    if hasattr(getattr(model, "ln_final", None), "hook_scale"):
        names.append("ln_final.hook_scale")
    for layer in range(model.cfg.n_layers):
        names.append(f"blocks.{layer}.attn.hook_z")
        if not model.cfg.attn_only:
            names.append(f"blocks.{layer}.mlp.hook_post")
        for norm in _output_norms(model, layer):
            if norm is not None:
                names.append(norm.hook_scale.name)
    return names


@dataclass
class Decompositions:
    """``Decomposition`` of a batch of prompts of one length: the same fields with a
    leading prompt axis (target, embed, biases: (B,); neurons, activations:
    (B, n_layers, d_mlp); heads: (B, n_layers, n_heads); logits: (B, d_vocab))."""

    target: np.ndarray
    neurons: np.ndarray
    heads: np.ndarray
    embed: np.ndarray
    biases: np.ndarray
    activations: np.ndarray
    logits: np.ndarray

    def __getitem__(self, i: int) -> Decomposition:
        return Decomposition(target=float(self.target[i]), neurons=self.neurons[i],
                             heads=self.heads[i], embed=float(self.embed[i]),
                             biases=float(self.biases[i]), activations=self.activations[i],
                             logits=self.logits[i])


def _adjoint(norm, scale: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """N^T u for the frozen linear part N of ``norm`` (a TransformerLens LayerNorm or
    RMSNorm, with or without weights) at ``scale``: (B, d_model) directions, (B, 1)
    scales."""
    w = getattr(norm, "w", None)
    v = u * w.detach().double() if w is not None else u.clone()
    if "RMS" not in type(norm).__name__:
        v = v - v.mean(-1, keepdim=True)
    return v / scale.reshape(len(u), 1)


def _bias_term(norm, d: torch.Tensor) -> torch.Tensor:
    b = getattr(norm, "b", None)
    return torch.zeros(len(d), dtype=torch.float64, device=d.device) if b is None \
        else d @ b.detach().double()


@torch.no_grad()
def decompose_batch(model: HookedTransformer, tokens: np.ndarray, answers: np.ndarray,
                    competitors: np.ndarray) -> Decompositions:
    """The exact direct decomposition of T (module doc) for a batch of prompts of one
    length: ``tokens`` (B, L), ``answers`` (B,) each prompt's answer token, one set of
    ``competitors`` (the operator's; each prompt's own answer is left out of its mean).
    Only the last position is kept from each hook."""
    toks = torch.as_tensor(np.asarray(tokens), dtype=torch.long, device=model.W_U.device)
    cache: dict[str, torch.Tensor] = {}

    def keep(x, hook):
        cache[hook.name] = x[:, -1].detach()
        return x

    names = set(hook_names(model))
    logits = model.run_with_hooks(toks, fwd_hooks=[(lambda n: n in names, keep)])[:, -1]
    return decompose_cached(model, cache, logits, answers, competitors)


@torch.no_grad()
def decompose_cached(model: HookedTransformer, cache: Mapping[str, torch.Tensor],
                     logits: torch.Tensor, answers: np.ndarray, competitors: np.ndarray
                     ) -> Decompositions:
    """``decompose_batch`` from a forward already run: ``cache`` holds every hook of
    ``hook_names(model)`` at the decomposed position, (B, ...) each; ``logits`` (B, d_vocab)
    the model's logits there. A caller that needs other hooks or positions of the same
    forward (``catalog.explain.prompt``: the lens and the greedy check) runs it once."""
    cfg = model.cfg
    dev = model.W_U.device
    ans = torch.as_tensor(np.asarray(answers), dtype=torch.long, device=dev)
    comp = torch.as_tensor(np.asarray(competitors), dtype=torch.long, device=dev)
    w_u = model.W_U.detach()  # (d_model, d_vocab): only the columns used, in float64
    others = (comp[None, :] != ans[:, None]).double()  # (B, C): the competitors of each
    weights = others / others.sum(1, keepdim=True)
    d = w_u[:, ans].double().T - weights @ w_u[:, comp].double().T  # (B, d_model)
    b_u = model.b_U.detach()
    biases = b_u[ans].double() - weights @ b_u[comp].double()
    norm = getattr(model, "ln_final", None)
    if norm is not None and "ln_final.hook_scale" in cache:
        u = _adjoint(norm, cache["ln_final.hook_scale"].double(), d)
        biases = biases + _bias_term(norm, d)
    else:  # no final norm
        u = d
    # T from the model's own final norm and unembedding (before any soft cap), in its dtype
    last = cache[f"blocks.{cfg.n_layers - 1}.hook_resid_post"][:, None]
    pre = model.unembed(norm(last) if norm is not None else last)[:, -1].double()
    target = pre.gather(1, ans[:, None])[:, 0] - (pre[:, comp] * weights).sum(1)
    b = len(ans)
    n_mlp = 0 if cfg.attn_only else int(cfg.d_mlp or 0)
    neurons = torch.zeros((b, cfg.n_layers, n_mlp), dtype=torch.float64)
    acts = torch.zeros((b, cfg.n_layers, n_mlp), dtype=torch.float64)
    heads = torch.zeros((b, cfg.n_layers, cfg.n_heads), dtype=torch.float64)
    for layer in range(cfg.n_layers):
        attn_norm, mlp_norm = _output_norms(model, layer)
        u_attn, u_mlp = u, u
        if attn_norm is not None:
            u_attn = _adjoint(attn_norm, cache[attn_norm.hook_scale.name].double(), u)
            biases = biases + _bias_term(attn_norm, u)
        z = cache[f"blocks.{layer}.attn.hook_z"].double()  # (B, n_heads, d_head)
        w_o = model.blocks[layer].attn.W_O.detach().double()  # (n_heads, d_head, d_model)
        heads[:, layer] = torch.einsum("bhd,hdm,bm->bh", z, w_o, u_attn).cpu()
        biases = biases + u_attn @ model.blocks[layer].attn.b_O.detach().double()
        if cfg.attn_only:
            continue
        if mlp_norm is not None:
            u_mlp = _adjoint(mlp_norm, cache[mlp_norm.hook_scale.name].double(), u)
            biases = biases + _bias_term(mlp_norm, u)
        post = cache[f"blocks.{layer}.mlp.hook_post"].double()  # (B, d_mlp)
        read = u_mlp @ w_out(model, layer).detach().double().T  # (B, d_mlp)
        neurons[:, layer] = (post * read).cpu()
        acts[:, layer] = post.cpu()
        biases = biases + u_mlp @ b_out(model, layer).detach().double()
    embed = (cache["blocks.0.hook_resid_pre"].double() * u).sum(-1)
    return Decompositions(target=target.cpu().numpy(), neurons=neurons.numpy(),
                          heads=heads.numpy(), embed=embed.cpu().numpy(),
                          biases=biases.cpu().numpy(), activations=acts.numpy(),
                          logits=logits.float().cpu().numpy())


def decompose(model: HookedTransformer, tokens: np.ndarray, answer: int,
              competitors: np.ndarray) -> Decomposition:
    """The exact direct decomposition of T (module doc) for one prompt's ``tokens``."""
    return decompose_batch(model, np.asarray(tokens)[None], np.array([answer]),
                           competitors)[0]
