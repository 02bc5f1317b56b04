"""Sizing the draft vocabulary: coverage of the supervised reply tokens vs the drafter's proposal latency.

For each size (and the full vocabulary) it reports which share of the training replies' tokens the K most frequent
tokens cover (the ceiling on how often a draft can be right), and the median time of one `propose` call (γ = 7,
greedy) at batch 1 and 8 for a drafter of the shipped shape over that vocabulary, all sizes interleaved in one run.

    OMP_NUM_THREADS=1 python benchmarks/draft_vocab.py --threads 1 --repeats 9 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from hf_dspark import DSparkDrafter
from hf_dspark.defaults import load_default_target
from hf_dspark.io_utils import write_json_atomic
from hf_dspark.model.configuration_dspark import DSparkConfig
from hf_dspark.model.draft_vocab import count_tokens, coverage, select_draft_vocab
from hf_dspark.provenance import processor_kind, with_provenance
from hf_dspark.training.data import build_dataset, load_conversations
from hf_dspark.training.drafter_init import end_of_turn_ids

SHAPE = {"num_hidden_layers": 2, "block_size": 7, "markov_rank": 64, "mask_token_id": 16}


def propose_seconds(drafter: DSparkDrafter, rows: int, context: int, repeats: int) -> float:
    """Median seconds of one greedy `propose` for `rows` requests after `context` cached tokens."""
    width = drafter.config.num_taps * drafter.config.hidden_size
    cache = drafter.init_cache(rows, capacity=context + 8)
    drafter.extend_context(cache, torch.randn(rows, context, width), torch.ones(rows, context, dtype=torch.bool))
    anchors = torch.randint(100, 1000, (rows,))
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        drafter.propose(anchors, cache)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", nargs="+", default=["data/train_regenerated"], help="Regenerated JSONL files/dirs.")
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192, 16384, 32768], help="Sizes to compare.")
    parser.add_argument("--repeats", type=int, default=15, help="Timed propose calls per size and batch.")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (pinned).")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="Target/drafter dtype.")
    parser.add_argument("--out", default=None, help=("Result JSON, a PNG beside it "
                        "(default: benchmarks/results/<processor kind>/draft_vocab.json)."))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load_default_target(getattr(torch, args.dtype))
    examples = build_dataset(load_conversations(args.data), tokenizer).examples
    counts = count_tokens((e["input_ids"], e["loss_mask"]) for e in examples)
    vocab = target.config.vocab_size
    rows = {}
    drafters = {}
    for size in [*args.sizes, vocab]:
        ids = select_draft_vocab(counts, size, vocab, end_of_turn_ids(tokenizer))
        torch.manual_seed(0)
        drafter = DSparkDrafter(DSparkConfig.from_target(target.config, **SHAPE)).bind_target(target).eval()
        if size < vocab:
            drafter.restrict_draft_vocab(ids)
        drafters[size] = drafter
        rows[size] = {"draft_vocab_size": size, "coverage": round(coverage(counts, ids), 5)}
    for batch in (1, 8):  # interleave the sizes within each repeat block
        samples = {size: [] for size in drafters}
        for _ in range(3):
            for size, drafter in drafters.items():
                samples[size].append(propose_seconds(drafter, batch, 256, max(1, args.repeats // 3)))
        for size in drafters:
            rows[size][f"propose_ms_batch{batch}"] = round(1000 * statistics.median(samples[size]), 2)
    report = {"threads": args.threads, "dtype": args.dtype, "gamma": 7, "supervised_tokens": sum(counts.values()),
              "sizes": list(rows.values())}
    args.out = args.out or f"benchmarks/results/{processor_kind()}/draft_vocab.json"
    write_json_atomic(Path(args.out), with_provenance(report), indent=1)
    plot(report, Path(args.out).with_suffix(".png"))
    for row in rows.values():
        print(row)


def plot(report: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    sizes = report["sizes"]
    fig = Figure(figsize=(6.4, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    x = [row["draft_vocab_size"] for row in sizes]
    ax.plot(x, [100 * row["coverage"] for row in sizes], "o-", color="tab:blue", label="coverage of reply tokens")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("draft vocabulary size")
    ax.set_ylabel("coverage (%)")
    twin = ax.twinx()
    for batch, style in ((1, "s--"), (8, "^--")):
        twin.plot(x, [row[f"propose_ms_batch{batch}"] for row in sizes], style, color="tab:red",
                  label=f"propose latency, batch {batch}")
    twin.set_ylabel(f"propose latency (ms, γ = {report['gamma']}, {report['threads']} thread)")
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], loc="center right", fontsize=8)
    ax.set_title("Draft vocabulary: coverage vs drafting cost")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
