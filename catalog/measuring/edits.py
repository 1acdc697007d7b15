"""Edits of MLP neurons at a prompt's last position, and what the answer does after them.

The knockouts and the steering tests (``catalog.circuits.knockouts``,
``catalog.explain.controls``, ``catalog.explain.steering``) all set some neurons'
activations (``blocks.L.mlp.hook_post``) at the last position, to zero or to given
values, per row of a batch, and read the answer's probability and the top token. One
hook builder and one reader serve them all.
"""

from __future__ import annotations

import numpy as np
import torch


def edit_hooks(mask: torch.Tensor, values: torch.Tensor | None, n_layers: int,
               last_only: bool = True) -> list:
    """TransformerLens hooks that set the masked neurons ((B, n_layers, d_mlp)) of each row
    to ``values`` (zero where None) at the last position (at the only position the hook
    sees when ``last_only`` is False: a cached single-position run)."""
    layers = [layer for layer in range(n_layers) if bool(mask[:, layer].any())]

    def hook_for(layer: int):
        def hook(post, hook):
            m = mask[:, layer]
            new = torch.zeros_like(post[:, -1]) if values is None \
                else values[:, layer].to(post.dtype)
            post = post.clone()
            post[:, -1] = torch.where(m, new, post[:, -1])
            return post
        return hook

    return [(f"blocks.{layer}.mlp.hook_post", hook_for(layer)) for layer in layers]


def read_answers(logits: torch.Tensor, answers: torch.Tensor
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p of each row's answer, whether it is the top token, the top token) of (B, d_vocab)
    last-position logits."""
    logits = logits.double()
    ans = answers.to(logits.device)
    p = logits.softmax(-1).gather(1, ans[:, None])[:, 0]
    top = logits.argmax(-1)
    return p.cpu().numpy(), (top == ans).cpu().numpy(), top.cpu().numpy()
