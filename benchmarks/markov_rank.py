"""Choose the Markov head's rank r by measurement: what each rank costs, and what a trained head uses.

Two measurements, both on the embedded SmolLM2-135M-Instruct target (V = 49,152, d = 576), CPU, torch pinned to
ONE thread (torch.set_num_threads(1)):

1. Cost: parameters and bf16 bytes of a 2-layer drafter at r ∈ {none, 16, 32, 64, 128, 256}, and the median
   latency of one `propose` call (γ = 7, greedy) at batch 1 and 8 over a 200-token context, interleaved across
   ranks so machine noise hits all of them alike. Weights are random: latency does not depend on their values.
2. Use: for a trained drafter (`--trained PATH`), the singular-value spectrum of its learned bigram bias
   B = W1·W2 (V×V, computed through QR of the factors, never materialised) and the share of ‖B‖_F² captured by the
   top-k directions. If a rank-64 head puts most of its energy in far fewer directions, a larger r buys nothing.

    python benchmarks/markov_rank.py --trained src/hf_dspark/resources/drafters/smollm2-135m-instruct-dspark
Writes benchmarks/results/markov_rank.json (+ .png).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from hf_dspark import DSparkConfig, DSparkDrafter, load_default_target
from hf_dspark.io_utils import write_json_atomic
from hf_dspark.provenance import processor_kind, result_provenance

ROOT = Path(__file__).resolve().parents[1]
RANKS = [0, 16, 32, 64, 128, 256]


def make_drafter(target, rank: int) -> DSparkDrafter:
    head = dict(head_type="none", confidence_with_markov=False) if rank == 0 else dict(markov_rank=rank)
    config = DSparkConfig.from_target(target.config, block_size=7, mask_token_id=16, **head)
    return DSparkDrafter(config).eval().bind_target(target)


def time_propose(drafter: DSparkDrafter, batch: int, context: int) -> float:
    """One `propose` call over a `context`-token cache, in ms."""
    cache = drafter.init_cache(batch, capacity=context + 16)
    width = len(drafter.config.target_layer_ids) * drafter.config.hidden_size
    gen = torch.Generator().manual_seed(0)
    drafter.extend_context(cache, torch.randn(batch, context, width, generator=gen),
                           torch.ones(batch, context, dtype=torch.bool))
    anchors = torch.randint(0, drafter.config.vocab_size, (batch,), generator=gen)
    with torch.no_grad():
        start = time.perf_counter()
        drafter.propose(anchors, cache, do_sample=False)
    return (time.perf_counter() - start) * 1e3


def cost_table(target, batches: list[int], repeats: int, context: int) -> dict:
    drafters = {r: make_drafter(target, r) for r in RANKS}
    samples = {(r, b): [] for r in RANKS for b in batches}
    for _ in range(2):  # warm-up
        for r in RANKS:
            for b in batches:
                time_propose(drafters[r], b, context)
    for _ in range(repeats):
        for r in RANKS:
            for b in batches:
                samples[(r, b)].append(time_propose(drafters[r], b, context))
    rows = {}
    for r, drafter in drafters.items():
        params = sum(p.numel() for p in drafter.parameters())
        rows["none" if r == 0 else str(r)] = {
            "parameters": params, "bf16_megabytes": round(params * 2 / 2**20, 1),
            **{f"propose_ms_batch{b}": round(statistics.median(samples[(r, b)]), 2) for b in batches}}
    return rows


@torch.no_grad()
def bias_spectrum(path: str) -> dict:
    """Singular values of B = W1 W2 from QR(W1), QR(W2ᵀ): B = Q1 (R1 R2ᵀ) Q2ᵀ, so σ(B) = σ(R1 R2ᵀ)."""
    drafter = DSparkDrafter.from_pretrained(path, dtype=torch.float32)
    head = drafter.markov_head
    w1, w2 = head.markov_w1.weight.float(), head.markov_w2.weight.float()  # [V, r] embedding, [V, r] projection
    _, r1 = torch.linalg.qr(w1)
    _, r2 = torch.linalg.qr(w2)
    sigma = torch.linalg.svdvals(r1 @ r2.T)
    energy = (sigma**2).cumsum(0) / (sigma**2).sum()
    ks = [k for k in (4, 8, 16, 32, 48, 64) if k <= sigma.numel()]
    # W1, W2 start as V×r Gaussians of std s, whose product has singular values ≈ V·s²: the level of untrained noise
    init_sigma = drafter.config.vocab_size * drafter.config.initializer_range**2
    return {"rank": int(sigma.numel()), "singular_values": [round(float(s), 4) for s in sigma],
            "energy_top_k": {str(k): round(float(energy[k - 1]), 4) for k in ks},
            "init_noise_singular_value": round(init_sigma, 2),
            "directions_above_twice_init_noise": int((sigma > 2 * init_sigma).sum())}


def plot(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 2 if "trained_bias" in result else 1
    fig, axes = plt.subplots(1, panels, figsize=(4.6 * panels, 3.6), squeeze=False)
    ax = axes[0][0]
    labels = list(result["cost"])
    for key in [k for k in next(iter(result["cost"].values())) if k.startswith("propose_ms")]:
        ax.plot(labels, [result["cost"][lab][key] for lab in labels], marker="o", label=key.replace("propose_ms_", ""))
    ax.set(xlabel="Markov rank r", ylabel="propose latency (ms, median)", title="Cost of the Markov head (CPU, 1 thr)")
    ax.legend(fontsize=8)
    if panels == 2:
        sigma = torch.tensor(result["trained_bias"]["singular_values"])
        energy = (sigma**2).cumsum(0) / (sigma**2).sum()
        axes[0][1].plot(range(1, len(energy) + 1), energy.tolist())
        axes[0][1].set(xlabel="top-k singular directions", ylabel="share of ‖B‖²_F", ylim=(0, 1.02),
                       title="Trained bias B = W1·W2 (rank 64)")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trained", default=None, help="trained drafter folder for the spectrum")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8],
                        help="batch sizes (rows) at which propose is timed")
    parser.add_argument("--repeats", type=int, default=7,
                        help="timed propose calls per rank and batch, after 2 warm-up sweeps (median)")
    parser.add_argument("--context", type=int, default=200, help="tokens in the drafter's cache before each propose")
    parser.add_argument("--out", default=None, help=("JSON report path, PNG beside it "
                        "(default: benchmarks/results/<processor kind>/markov_rank.json)"))
    parser.add_argument("--spectrum-only", action="store_true", help="keep the cost table of an existing --out")
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.out = args.out or str(ROOT / "benchmarks" / "results" / processor_kind() / "markov_rank.json")
    if args.spectrum_only:
        result = json.loads(Path(args.out).read_text())
    else:
        target, _ = load_default_target(dtype=torch.float32)
        result = {"threads": 1, "context": args.context, "gamma": 7,
                  "cost": cost_table(target, args.batches, args.repeats, args.context)}
    if args.trained:
        result["trained_bias"] = bias_spectrum(args.trained)
    result["provenance"] = result_provenance()
    write_json_atomic(Path(args.out), result)
    plot(result, Path(args.out).with_suffix(".png"))
    for name, row in result["cost"].items():
        print(f"r={name:>4}: " + ", ".join(f"{k}={v}" for k, v in row.items()))
    if args.trained:
        bias = result["trained_bias"]
        print("trained bias energy in top-k directions:", bias["energy_top_k"], "; directions above 2× the init "
              f"noise level ({bias['init_noise_singular_value']}): {bias['directions_above_twice_init_noise']}")


if __name__ == "__main__":
    main()
