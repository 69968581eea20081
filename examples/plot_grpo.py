"""Reward against step for ``grpo_tiny.py``, ``trl_grpo_tiny.py`` and ``areal_grpo_tiny.py``
reports (``--json``), one line per report, with its greedy evaluation before and after
as points; needs matplotlib::

    python examples/plot_grpo.py grpo-sample.json grpo-group.json -o grpo-reward.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", type=Path, nargs="+",
                        help="grpo_tiny.py, trl_grpo_tiny.py or areal_grpo_tiny.py --json reports")
    parser.add_argument("--title", default="", help="a title over the plot")
    parser.add_argument("-o", "--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--window", type=int, default=5,
                        help="steps in the moving mean drawn over each line (default 5)")
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for path in args.reports:
        report = json.loads(path.read_text())
        steps = [s["step"] for s in report["steps"]]
        reward = [s["reward"] for s in report["steps"]]
        label = f"{report.get('admission', path.stem)} admission"
        line, = ax.plot(steps, reward, alpha=0.35, linewidth=1)
        w = args.window
        mean = [sum(reward[max(0, i - w + 1):i + 1]) / len(reward[max(0, i - w + 1):i + 1])
                for i in range(len(reward))]
        ax.plot(steps, mean, color=line.get_color(), linewidth=2,
                label=f"{label}: sampled reward ({w}-step mean)")
        if report.get("eval_before") is not None:  # None: a run that trained nothing
            ax.scatter([0, steps[-1]], [report["eval_before"], report["eval_after"]],
                       color=line.get_color(), marker="D", zorder=3,
                       label=f"{label}: greedy eval before / after")
    ax.axhline(1 / 8, color="grey", linestyle=":", linewidth=1,
               label="a policy that ignores the key (1/8)")
    ax.set_xlabel("GRPO step (a weight update each)")
    ax.set_ylabel("reward (share of answer tokens right)")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7, loc="upper left")
    if args.title:
        ax.set_title(args.title, fontsize=9)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
