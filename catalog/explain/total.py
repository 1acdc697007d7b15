"""Total effects of every MLP neuron on one prompt's answer, to first order.

The direct decomposition (``catalog.explain.decompose``) counts what a neuron writes
straight into the answer's logit difference T; a neuron of a middle layer that changes
what the late layers compute counts as nothing there. Its total effect is what T loses
when the neuron is zeroed at the prompt's last position, every later layer recomputed,
and the final norm's scale kept at its value on the prompt, as the decomposition keeps
it. To first order (attribution patching, with zero as the counterfactual):

    total_n = dT/dk_n * k_n

at the last position, k_n the neuron's activation (``blocks.L.mlp.hook_post``). One
forward and one backward give every neuron's (each prompt's T depends only on its own
row, so a batch's T summed gives each row's gradient). T here is the answer token's
logit minus the mean logit of the competing number tokens, as in the decomposition,
from the model's own final logits. For a neuron of the last layer the total effect is
its direct term.

Why the final norm's scale is kept: a norm is blind to the scale of its input, so with
the scale live the first-order effects of all writes into the last residual stream sum
to about 0 (each write's effect loses its share of T along the stream's own direction),
and no share of T could be read from them. The intermediate norms (of later blocks)
respond, which is how a neuron acts through later layers. ``exact_zeroing`` measures the
same quantity exactly for a few neurons (one forward each, batched), the check of the
first-order estimate.
"""

from __future__ import annotations

import numpy as np
import torch
from transformer_lens import HookedTransformer


def _target(logits: torch.Tensor, answers: torch.Tensor, competitors: torch.Tensor
            ) -> torch.Tensor:
    """(B,) the answer's logit minus the mean of the competitors' (each row's own answer
    left out of its mean)."""
    others = (competitors[None, :] != answers[:, None]).to(logits.dtype)
    mean = (logits[:, competitors] * others).sum(1) / others.sum(1)
    return logits.gather(1, answers[:, None])[:, 0] - mean


def _final_scale(model: HookedTransformer) -> bool:
    """Whether the model has a final norm with a scale to keep."""
    return hasattr(getattr(model, "ln_final", None), "hook_scale")


def total_effects(model: HookedTransformer, tokens: np.ndarray, answers: np.ndarray,
                  competitors: np.ndarray, batch: int = 16) -> np.ndarray:
    """(B, n_layers, d_mlp) float64: each neuron's first-order total effect on T (module
    doc) for a batch of prompts of one length (``tokens`` (B, L))."""
    cfg = model.cfg
    n_layers, d_mlp = cfg.n_layers, int(cfg.d_mlp or 0)
    dev = model.W_U.device
    out = np.zeros((len(tokens), n_layers, d_mlp))
    comp = torch.as_tensor(np.asarray(competitors), dtype=torch.long, device=dev)
    for s in range(0, len(tokens), batch):
        toks = torch.as_tensor(np.asarray(tokens[s:s + batch]), dtype=torch.long, device=dev)
        ans = torch.as_tensor(np.asarray(answers[s:s + batch]), dtype=torch.long, device=dev)
        posts: dict[int, torch.Tensor] = {}
        kept: dict[int, torch.Tensor] = {}

        def keep(post, hook, posts=posts, kept=kept):
            # a leaf added at the last position: its gradient is the activation's there
            delta = torch.zeros_like(post[:, -1]).requires_grad_(True)
            posts[hook.layer()] = delta
            post = post.clone()
            post[:, -1] = post[:, -1] + delta
            kept[hook.layer()] = post[:, -1].detach()
            return post

        hooks: list = [(lambda n: n.endswith("mlp.hook_post"), keep)]
        if _final_scale(model):
            hooks.append(("ln_final.hook_scale", lambda x, hook: x.detach()))

        with torch.enable_grad():
            logits = model.run_with_hooks(toks, fwd_hooks=hooks)[:, -1]
            t = _target(logits.double(), ans, comp)
            layers = sorted(posts)
            grads = torch.autograd.grad(t.sum(), [posts[layer] for layer in layers])
        for layer, g in zip(layers, grads, strict=True):
            out[s:s + len(toks), layer] = (g.double() * kept[layer].double()).cpu().numpy()
    return out


@torch.no_grad()
def exact_zeroing(model: HookedTransformer, tokens: np.ndarray, answer: int,
                  competitors: np.ndarray, neurons: list[tuple[int, int]],
                  scale: float = 1.0) -> np.ndarray:
    """(len(neurons),) what T loses when each neuron's activation at the last position is
    multiplied by 1 - ``scale`` (1: zeroed), the final norm's scale kept at the clean
    prompt's (row 0's), one batched forward; divided by ``scale``, so that a small scale
    gives the derivative ``total_effects`` estimates."""
    dev = model.W_U.device
    n = len(neurons) + 1
    toks = torch.as_tensor(np.asarray(tokens), dtype=torch.long, device=dev)[None].expand(n, -1)
    by_layer: dict[int, list[tuple[int, int]]] = {}
    for row, (layer, k) in enumerate(neurons, start=1):
        by_layer.setdefault(layer, []).append((row, k))

    def hook_for(rows):
        r = torch.as_tensor([x for x, _ in rows], device=dev)
        k = torch.as_tensor([y for _, y in rows], device=dev)

        def hook(post, hook):
            post = post.clone()
            post[r, -1, k] = post[r, -1, k] * (1.0 - scale)
            return post
        return hook

    hooks: list = [(f"blocks.{layer}.mlp.hook_post", hook_for(rows))
             for layer, rows in by_layer.items()]
    if _final_scale(model):
        clean: dict[str, torch.Tensor] = {}

        def record(x, hook):
            clean["scale"] = x[:1].detach()
            return x
        model.run_with_hooks(toks[:1], fwd_hooks=[("ln_final.hook_scale", record)])
        hooks.append(("ln_final.hook_scale",
                      lambda x, hook: clean["scale"].expand_as(x).to(x.dtype)))
    logits = model.run_with_hooks(toks, fwd_hooks=hooks)[:, -1].double()
    comp = torch.as_tensor(np.asarray(competitors), dtype=torch.long, device=dev)
    t = _target(logits, torch.full((n,), int(answer), device=dev), comp).cpu().numpy()
    return (t[0] - t[1:]) / scale
