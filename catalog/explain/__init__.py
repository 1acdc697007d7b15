"""One prompt, explained (issue 47): which components carry its answer. The exact direct
decomposition of the answer's logit difference over every MLP neuron and attention head
with the normalisations' scales frozen (``decompose``), and the explanation built on it
(``prompt``): the model's answer, the logit lens per layer, the top neurons with their
labels and whether each label's heuristic holds for this prompt, the sums by heuristic
family, and the prompt knockout against controls chosen the same way except for the label
(``controls``), whether a label holds for a prompt by its set and its side (``holds``),
total effects (``total``), what the label adds over many prompts against the labels
placed at random (``shares``, ``label_figures``) and the steering test (``steering``).

May import every package of the catalog but ``run``."""

# the catalog's packages this one may import; tests/unit/test_layers.py fails on any
# import of another
MAY_IMPORT: tuple[str, ...] = (
    "core", "config", "measuring", "builtin", "sources", "labels", "periodic", "circuits")
