"""The `hf-dspark verify` report: a one-screen summary of `verify.certify`'s result and its figure."""

from __future__ import annotations

from pathlib import Path

VERDICT_NOTES = {
    "pass": "no difference found",
    "pass (near-ties)": "every divergence is a near-tie of the target's own logits in this dtype (expected in "
                        "bf16/fp16, where verifying several positions at once may round differently)",
    "fail": "NOT lossless",
    "inconclusive": "too few drafts were accepted to test anything",
}


def _greedy_lines(greedy: dict) -> list[str]:
    lines = [f"greedy    {greedy['verdict']:17s} {greedy['identical']}/{len(greedy['prompts'])} prompts identical "
             f"to plain generate, {greedy['accepted_drafts']} drafts accepted"]
    for row in greedy["prompts"]:
        at = row["first_divergence"]
        if at is None:
            continue
        if "top2_logits" not in row:
            lines.append(f"          prompt {row['prompt']}: lengths differ from token {at}")
            continue
        top = ", ".join(f"{t}: {v:.4f}" for t, v in zip(row["top2_tokens"], row["top2_logits"]))
        lines.append(f"          prompt {row['prompt']}: first divergence at token {at}: plain {row['plain_token']} "
                     f"vs speculative {row['speculative_token']}; top-2 logits {top}; gap {row['logit_gap']:.2e} "
                     f"({'near-tie' if row['near_tie'] else 'not a tie'}, tolerance {row['tie_tolerance']:.1e})")
    return lines


def _sampling_lines(sampling: dict) -> list[str]:
    lines = [f"sampling  {sampling['verdict']:17s} {sampling['samples']} samples per arm at T = "
             f"{sampling['temperature']:g} (top-k/top-p off), {sampling['accepted_drafts']} drafts accepted; "
             f"α = {sampling['alpha']:g} over the positions (Bonferroni), power {sampling['power']:g}"]
    for row in sampling["positions"]:
        given = f" | prefix {row['prefix']}" if row["prefix"] else ""
        if "skipped" in row:
            lines.append(f"          position {row['position']}{given}: not tested ({row['skipped']})")
            continue
        lines.append(f"          position {row['position']}{given}: χ² = {row['statistic']:.1f} (dof {row['dof']}), "
                     f"p = {row['pvalue']:.3g}, TV = {row['total_variation']:.3f} (n = {row['n_plain']}/"
                     f"{row['n_speculative']}; detects a shift of {row['detectable_difference']:.3f} in one token's "
                     "probability)")
    return lines


def _quality_lines(quality: dict) -> list[str]:
    plain, speculative = quality["exact_match"]["plain"], quality["exact_match"]["speculative"]
    low, high = quality["interval"]
    return [f"quality   {quality['verdict']:17s} final-answer exact match vs plain greedy (evaluate): plain "
            f"{plain:.3f}, speculative {speculative:.3f}, difference {quality['difference']:+.3f} "
            f"[{low:+.3f}, {high:+.3f}] ({quality['confidence']:.0%} interval, {quality['samples_per_arm']} "
            f"answers per arm at T = {quality['temperature']:g})"]


def summary_lines(report: dict) -> list[str]:
    """One screen: the overall verdict, then each check's verdict and figures."""
    lines = [f"losslessness certificate: {report['verdict'].upper()} ({VERDICT_NOTES[report['verdict']]})",
             f"target {report.get('target', '?')} ({report['dtype']}), drafter {report.get('drafter', '?')}"]
    lines += _greedy_lines(report["greedy"]) + _sampling_lines(report["sampling"])
    if "quality" in report:
        lines += _quality_lines(report["quality"])
    if report["verdict"] == "inconclusive":
        lines.append("an inconclusive check accepted fewer than min_accepted drafts: use prompts on which the "
                     "drafter is accepted (e.g. its training domain), more prompts or more samples")
    return lines


def plot_certificate(report: dict, path: str | Path) -> str:
    """Per tested position: the total variation between plain and speculative samples beside the shift the test
    detects, and the p-value against the level. Returns the PNG's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tested = [row for row in report["sampling"]["positions"] if "pvalue" in row]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    positions = [row["position"] for row in tested]
    left.bar([p - 0.2 for p in positions], [row["total_variation"] for row in tested], width=0.4,
             label="TV(plain, speculative)")
    left.bar([p + 0.2 for p in positions], [row["detectable_difference"] for row in tested], width=0.4,
             label=f"detectable shift (power {report['sampling']['power']:g})")
    left.set_xlabel("generated position (later ones given a fixed prefix)")
    left.set_title("sampling: observed difference", fontsize=9)
    left.legend(fontsize=7)
    right.scatter(positions, [max(row["pvalue"], 1e-300) for row in tested], label="χ² p-value")
    right.axhline(report["sampling"]["per_position_level"], color="red", linestyle="--", label="level (Bonferroni)")
    right.set_yscale("log")
    right.set_xlabel("generated position")
    right.set_title(f"verdict: {report['verdict']}", fontsize=9)
    right.legend(fontsize=7)
    for ax in (left, right):
        ax.set_xticks(positions or [1])
    fig.tight_layout()
    path = str(Path(path))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
