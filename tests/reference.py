"""Slow reference implementations that the fast code must equal (used by tests and bench)."""

import numpy as np
import torch

from catalog.grids import post_hook_name
from catalog.patching import effect_from_logprobs


def naive_patching(model, table, layer, clean, cf):
    """The slow reference: one full forward per neuron with a hook on hook_post."""
    toks = torch.from_numpy(table.token_matrix(clean))
    name = post_hook_name(layer)
    with torch.no_grad():
        cf_vals = torch.cat([
            model.run_with_cache(torch.from_numpy(table.tokens[j][None]), names_filter=name)[1][
                name][:, -1]
            for j in cf])
        lp = model(toks)[:, -1].log_softmax(-1)
    r, rp = torch.from_numpy(table.answer[clean]), torch.from_numpy(table.answer[cf])
    rows = torch.arange(len(clean))
    out = np.zeros((model.cfg.d_mlp, len(clean)))
    for n in range(model.cfg.d_mlp):
        def hook(act, hook, n=n):
            act[:, -1, n] = cf_vals[:, n]
            return act
        with torch.no_grad():
            lps = model.run_with_hooks(toks, fwd_hooks=[(post_hook_name(layer), hook)])
        lps = lps[:, -1].log_softmax(-1)
        out[n] = effect_from_logprobs(lp[rows, r], lp[rows, rp], lps[rows, r], lps[rows, rp])
    return out


def per_neuron_scores(maps: np.ndarray, members: list[np.ndarray]) -> np.ndarray:
    """Algorithm 1 neuron by neuron, heuristic by heuristic, with the same fair tie rule.

    maps: (neurons, cells); members: one boolean cell mask per heuristic.
    """
    out = np.zeros((len(maps), len(members)))
    for n, values in enumerate(maps):
        desc = np.sort(values)[::-1]
        for j, member in enumerate(members):
            k = int(member.sum())
            kth = desc[k - 1]
            greater, tied = values > kth, values == kth
            share = (k - greater.sum()) / tied.sum()
            out[n, j] = ((greater & member).sum() + (tied & member).sum() * share) / k
    return out
