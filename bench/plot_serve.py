#!/usr/bin/env python3
"""Draws the JSON of `kvant bench serve` as a PNG: output tokens/s and
requests/s, TTFT, TPOT and inter-token latency (p50/p95/p99) against
concurrency. Run from the venv that scripts/setup.sh builds:

    .venv/bin/python bench/plot_serve.py bench-serve.json bench-serve.png

(`kvant bench serve --plot FILE.png` runs it for you.)
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    with open(src) as f:
        data = json.load(f)
    runs = sorted(data["runs"], key=lambda r: r["concurrency"])
    conc = [r["concurrency"] for r in runs]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    ax = axes[0][0]
    ax.plot(conc, [r["output_tok_s"] for r in runs], "o-", label="output tok/s")
    ax.set_ylabel("output tokens/s")
    ax2 = ax.twinx()
    ax2.plot(conc, [r["request_throughput"] for r in runs], "s--", color="tab:orange",
             label="requests/s")
    ax2.set_ylabel("requests/s")
    ax.set_title("throughput")
    ax.legend(loc="upper left")
    ax2.legend(loc="lower right")
    for ax, key, title in ((axes[0][1], "ttft_ms", "time to first token"),
                           (axes[1][0], "tpot_ms", "time per output token"),
                           (axes[1][1], "itl_ms", "inter-token latency")):
        for q, style in (("p50", "o-"), ("p95", "s--"), ("p99", "^:")):
            ax.plot(conc, [(r[key] or {}).get(q, float("nan")) for r in runs], style, label=q)
        ax.set_title(title)
        ax.set_ylabel("ms")
        ax.legend()
    for row in axes:
        for ax in row:
            ax.set_xscale("log", base=2)
            ax.set_xticks(conc, [str(c) for c in conc])
            ax.set_xlabel("concurrent clients")
            ax.grid(True, alpha=0.3)
    fig.suptitle(f"kvant bench serve: {data['model']}, {data['prompt_tokens']} prompt + "
                 f"{data['gen_tokens']} generated tokens per request")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: plot_serve.py RESULTS.json OUT.png")
    main(sys.argv[1], sys.argv[2])
