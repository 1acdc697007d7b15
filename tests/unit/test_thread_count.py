"""A checkpoint measured with one math thread and with two gives the same catalog (issue
79: the demo's worker now runs one pool process per core with one thread each, where it
ran one process with a thread per core). Labels, their scores, the effects, the stored
comparison's rival names and the summary's faithfulness are compared; each run is a
fresh interpreter whose thread counts are set before torch and numpy load."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np

RUN = textwrap.dedent("""
    import json, sys
    import numpy as np, torch
    from catalog import ScienceConfig, measure
    from catalog.sources import load_model
    from tiny_model import TINY
    torch.set_num_threads(int(sys.argv[2]))
    from pathlib import Path
    lm = load_model("builtin", None, builtin_config=TINY, cache_root=Path(sys.argv[1]))
    res = measure(lm.model, lm.tokenizer, ScienceConfig(operand_hi=20, operators=("+", "*")),
                  progress=False)
    out = {"threads": torch.get_num_threads(), "layers": {}}
    for layer, lr in sorted(res.layers.items()):
        m = lr.matches
        rows = sorted((int(m.neuron[i]), int(m.op[i]), m.row_heuristic(i).key,
                       bool(m.implements[i]), float(m.score[i])) for i in range(len(m)))
        ex = lr.explanations or {}
        out["layers"][str(layer)] = {
            "rows": rows, "rank_value": lr.rank_value.tolist(),
            "rivals": {k: [str(x) for x in np.asarray(v).ravel()]
                       for k, v in ex.items() if "other_op" in k}}
    out["faithfulness"] = res.summary.faithfulness
    print(json.dumps(out))
""")


def _start(root, threads: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "OPENBLAS_NUM_THREADS": str(threads),
           "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__) + "/..", *sys.path])}
    return subprocess.Popen([sys.executable, "-c", RUN, str(root), str(threads)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_one_thread_and_two_give_the_same_catalog(tiny_builtin):
    _, root = tiny_builtin
    runs = [_start(root, 1), _start(root, 2)]  # side by side: the results, not the time
    one, two = (_result(p) for p in runs)
    assert (one["threads"], two["threads"]) == (1, 2)
    assert one["layers"].keys() == two["layers"].keys() == {"0", "1"}
    labelled = 0
    for layer in one["layers"]:
        a, b = one["layers"][layer], two["layers"][layer]
        assert [r[:4] for r in a["rows"]] == [r[:4] for r in b["rows"]], layer
        np.testing.assert_allclose([r[4] for r in a["rows"]], [r[4] for r in b["rows"]],
                                   rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(a["rank_value"], b["rank_value"], rtol=1e-4, atol=1e-6)
        assert a["rivals"] == b["rivals"], layer
        labelled += sum(r[3] for r in a["rows"])
    assert labelled > 0  # the comparison covered labels
    for op, curve in one["faithfulness"].items():
        np.testing.assert_allclose([f for _, f in curve],
                                   [f for _, f in two["faithfulness"][op]], rtol=1e-4,
                                   atol=1e-6)
