"""The README's circuits table: one checkpoint's faithfulness under each protocol, from a
catalog database (what ``ncat catalog ... --protocols paper,all-layers`` stored).

Per operator and protocol: how the circuit was built, the metric on the model and on the
empty circuit, the ranked circuit's faithfulness (ratio of means of the normalised logit,
± bootstrap SE; the paper's mean of ratios beside it) at about 1% and 10% of each pruned
layer and with every neuron kept (the ceiling the ablated heads leave), the same for a
random circuit, the areas CPR of the ranked and the random curve, and the prompts whose
denominator is below 0.05.

Run: .venv/bin/python bench/circuits_table.py DATABASE_URL MODEL [STEP [CONFIG_ID]]
"""

from __future__ import annotations

import sys


def main() -> None:
    url, model = sys.argv[1], sys.argv[2]
    step = int(sys.argv[3]) if len(sys.argv) > 3 else None
    config_id = int(sys.argv[4]) if len(sys.argv) > 4 else None
    from reports.report import gather

    d = gather(url, model, step, config_id=config_id).circuits
    print("| op | protocol | built | NL model / empty | F at ~1% | F at ~10% | F, every "
          "neuron kept | random at ~10% | CPR ranked / random | small denominators |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for s in d.summaries:
        op, protocol = s["op"], s["protocol"]
        ranked = {p["k"]: p for p in d.curve(op, protocol, "ranked", "nl")}
        rand = {p["k"]: p for p in d.curve(op, protocol, "random", "nl")}
        mib = sorted(k for k, p in ranked.items() if p["mib"])
        width = mib[-1]

        def at(share: float, pts: dict, mib: list[int] = mib, width: int = width) -> str:
            k = min(mib, key=lambda k: abs(k / width - share))
            p = pts.get(k)
            if p is None:
                return "-"
            return (f"{p['ratio_of_means']:.2f} ± {p['ratio_of_means_se']:.2f} "
                    f"({p['mean_ratio']:.2f}) at k={k}")

        built = (f"{s['n_heads_kept']} heads; whole {_span(s['whole'])}; pruned "
                 f"{_span(s['pruned'])}")
        base = s["baselines"]["nl"]
        areas = s["areas"]
        cpr = [areas[c]["nl"]["ratio_of_means"] for c in ("ranked", "random")]
        print(f"| {op} | {protocol} | {built} | {base['model']:.2f} / {base['empty']:.2f} | "
              f"{at(0.01, ranked)} | {at(0.1, ranked)} | {at(1.0, ranked)} | "
              f"{at(0.1, rand)} | {cpr[0]['cpr']:.2f} ± {cpr[0]['cpr_se']:.2f} / "
              f"{cpr[1]['cpr']:.2f} ± {cpr[1]['cpr_se']:.2f} | {base['n_small']} of "
              f"{s['n_prompts']} |")


def _span(layers: list[int]) -> str:
    from reports.circuits import _layers

    return _layers(layers) if layers else "none"


if __name__ == "__main__":
    main()
