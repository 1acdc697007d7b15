"""Slow reference implementations that the fast code must equal (used by tests and bench)."""

import numpy as np
import torch

from catalog.measuring.ablation import z_hook_name
from catalog.measuring.grids import post_hook_name
from catalog.measuring.patching import effect_from_logprobs


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


# ------------------------------------------------------------------ ablations (§6)


@torch.no_grad()
def reference_means(model, population, context: str):
    """Mean hook_post and hook_z per layer by distance from the end of the sequence (0 =
    the last position), each prompt of ``population`` run whole and alone. ``context``
    ``prompt`` averages the prompt's own positions only, ``all`` every position.
    Returns (post (n_layers, D, d_mlp), z (n_layers, D, n_heads, d_head), count (D,))."""
    n_layers = model.cfg.n_layers
    longest = max(len(t) for t in population.tokens)
    post = torch.zeros(n_layers, longest, model.cfg.d_mlp, dtype=torch.float64)
    z = torch.zeros(n_layers, longest, model.cfg.n_heads, model.cfg.d_head, dtype=torch.float64)
    count = np.zeros(longest, dtype=np.int64)
    for i, toks in enumerate(population.tokens):
        _, cache = model.run_with_cache(torch.from_numpy(np.asarray(toks)[None]))
        start = len(population.prefix_tokens[int(population.op[i])]) if context == "prompt" \
            else 0
        for t in range(start, len(toks)):
            d = len(toks) - 1 - t
            count[d] += 1
            for layer in range(n_layers):
                post[layer, d] += cache[post_hook_name(layer)][0, t].double()
                z[layer, d] += cache[z_hook_name(layer)][0, t].double()
    have = torch.from_numpy(np.maximum(count, 1)).double()
    return post / have[None, :, None], z / have[None, :, None, None], count


@torch.no_grad()
def reference_ablated_logits(model, tokens, circuit, post_repl, z_repl, ablate_from: int):
    """Last-position logits of one sequence run whole with every neuron and head outside
    ``circuit`` replaced at positions >= ``ablate_from``: ``post_repl`` (n_layers, T, d_mlp)
    and ``z_repl`` (n_layers, T, n_heads, d_head) give the replacement at each absolute
    position."""
    hooks = []
    for layer in range(model.cfg.n_layers):
        drop_n = torch.as_tensor(~circuit.neurons[layer])
        drop_h = torch.as_tensor(~circuit.heads[layer])

        def on_post(act, hook, _l=layer, _d=drop_n):
            act = act.clone()
            part = act[0, ablate_from:]
            part[:, _d] = post_repl[_l, ablate_from:][:, _d].to(act.dtype)
            return act

        def on_z(act, hook, _l=layer, _d=drop_h):
            act = act.clone()
            part = act[0, ablate_from:]
            part[:, _d] = z_repl[_l, ablate_from:][:, _d].to(act.dtype)
            return act

        hooks += [(post_hook_name(layer), on_post), (z_hook_name(layer), on_z)]
    logits = model.run_with_hooks(torch.from_numpy(np.asarray(tokens)[None]), fwd_hooks=hooks)
    return logits[0, -1]


@torch.no_grad()
def reference_activations(model, tokens):
    """hook_post (n_layers, T, d_mlp) and hook_z (n_layers, T, n_heads, d_head) of one
    sequence run whole."""
    _, cache = model.run_with_cache(torch.from_numpy(np.asarray(tokens)[None]))
    n = model.cfg.n_layers
    return (torch.stack([cache[post_hook_name(x)][0] for x in range(n)]),
            torch.stack([cache[z_hook_name(x)][0] for x in range(n)]))


def reference_score(values: np.ndarray, member: np.ndarray, k: int | None = None) -> float:
    """Algorithm 1 for one neuron and one heuristic, written plainly ."""
    if k is None:
        k = int(member.sum())
    kth = np.sort(values)[::-1][k - 1]
    greater = values > kth
    tied = values == kth
    share = (k - greater.sum()) / tied.sum()
    return float(((greater & member).sum() + (tied & member).sum() * share) / k)


def sketch_reference(grid: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Slow reference of a sketch from a (side, side) grid with NaN for invalid cells:
    per-cell block means, row means and column means (NaN where a group is empty)."""
    side = grid.shape[0]
    out = np.full_like(grid, np.nan)
    for i in range(0, side, block):
        for j in range(0, side, block):
            tile = grid[i:i + block, j:j + block]
            if np.isfinite(tile).any():
                m = np.nanmean(tile)
                out[i:i + block, j:j + block] = np.where(np.isfinite(tile), m, np.nan)
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            rows, cols = np.nanmean(grid, axis=1), np.nanmean(grid, axis=0)
    return out, rows, cols


@torch.no_grad()
def reference_direct_effect(model, tokens, answer: int, competitors, component) -> float:
    """The direct effect of one component on T (the answer's logit minus the mean logit of
    ``competitors``, before any soft cap) by one hooked forward: the component's output at
    the last position removed (a neuron's activation or a head's z set to 0), every norm
    kept at its clean scale, and every later write (the blocks after it, and the MLP of
    its own block for a head) replaced by its clean value, so that only the component's
    own path to the unembedding changes. Returns T(clean) - T(removed).
    ``component``: ("neuron", layer, n) or ("head", layer, h)."""
    import torch

    kind, layer, idx = component
    toks = torch.as_tensor(tokens, dtype=torch.long)[None]
    comp = torch.as_tensor(competitors, dtype=torch.long)
    n_layers = model.cfg.n_layers

    def target(logits_pre):
        return float(logits_pre[answer] - logits_pre[comp].mean())

    _, clean = model.run_with_cache(toks)
    frozen = []
    for name in clean.keys():
        if name.endswith("hook_scale"):
            frozen.append((name, lambda x, hook, v=clean[name]: v))
    for later in range(layer + 1, n_layers):
        for part in ("hook_attn_out", "hook_mlp_out"):
            name = f"blocks.{later}.{part}"
            if name in clean:
                frozen.append((name, lambda x, hook, v=clean[name]: v))
    if kind == "head":
        if f"blocks.{layer}.hook_mlp_out" in clean:
            frozen.append((f"blocks.{layer}.hook_mlp_out",
                           lambda x, hook, v=clean[f"blocks.{layer}.hook_mlp_out"]: v))

        def remove(z, hook):
            z = z.clone()
            z[0, -1, idx] = 0.0
            return z
        frozen.append((f"blocks.{layer}.attn.hook_z", remove))
    else:
        def remove(post, hook):
            post = post.clone()
            post[0, -1, idx] = 0.0
            return post
        frozen.append((f"blocks.{layer}.mlp.hook_post", remove))
    grab = {}

    def keep(resid, hook):
        grab["resid"] = resid
        return resid
    last = f"blocks.{n_layers - 1}.hook_resid_post"
    with model.hooks(fwd_hooks=frozen + [(last, keep)]):
        model(toks)
        norm = getattr(model, "ln_final", None)
        removed = model.unembed(norm(grab["resid"]) if norm is not None else grab["resid"])
    resid = clean[last]
    with model.hooks(fwd_hooks=[h for h in frozen if h[0].endswith("hook_scale")]):
        norm = getattr(model, "ln_final", None)
        base = model.unembed(norm(resid) if norm is not None else resid)
    return target(base[0, -1].double()) - target(removed[0, -1].double())
