"""Benchmark: the decoding loop's own time per verification round on a CPU (the CPU proxy of its GPU overhead).

Every target forward is timed with forward hooks on the target, every drafter call (`propose`, `extend_context`; the
stock loop's `get_candidates`) by wrapping it. The loop overhead of a round is the gap between two consecutive
target forwards minus the drafter time inside it: the time the loop itself spends (acceptance, commit, stopping
checks, policy, bookkeeping). The gap after the first forward (prefill and setup) is left out. The target is a
tiny random Llama, so forwards are small and the overhead is what the numbers show.

Cases, interleaved (each repeat runs every case once, in rotated order), median and IQR over repeats:

- `plain`: plain greedy `generate`, per-step overhead, at every batch;
- `fixed`, `auto`: hf-dspark with the oracle drafter (every draft right) at every batch;
- `auto-nodraft` (batch 1): `auto` with drafts that are always wrong, so it decides not to draft; only the gaps
  before a one-token forward (the rounds it decoded plainly) are counted;
- `stock` (batch 1): transformers' own assisted loop fed the same oracle drafts by a candidate generator.

Ratios (per repeat, then median and IQR): fixed and auto against stock at batch 1 and against plain at each
batch, auto-nodraft against plain at batch 1. `--code-root` times another checkout (its `src/` is put first on
`PYTHONPATH` of a worker process) for a side-by-side table (`--before` prints one against another report of
this benchmark). Writes
`benchmarks/results/<processor kind>/loop_overhead.json` (another checkout: `loop_overhead.<commit>.json`), with the
provenance record (command, git commit, dirty flag, versions, processor, threads); the tables come from
`loop_overhead_report.py`.

    python benchmarks/loop_overhead.py --threads 1
    python benchmarks/loop_overhead.py --threads 1 --code-root /path/to/baseline-checkout --out /tmp/baseline.json
    python benchmarks/loop_overhead.py --threads 1 --before /tmp/baseline.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.generation.candidate_generator import CandidateGenerator

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling report module, however this file is loaded
from loop_overhead_report import before_after, markdown, summarize

ROOT = Path(__file__).resolve().parents[1]
PROMPT_LENGTHS = (16, 32)


@dataclass(frozen=True)
class Case:
    """One measured configuration: `method` in plain / dspark / stock, hf-dspark's policy, the drafts."""

    name: str
    method: str
    batch: int
    policy: str | None = None
    drafts: str = "oracle"  # "oracle" (all right) or "wrong" (all wrong)
    only_plain_rounds: bool = False

    @property
    def key(self) -> str:
        return f"{self.name}@{self.batch}"


def cases_for(batches: list[int]) -> list[Case]:
    cases = [Case("plain", "plain", b) for b in batches]
    cases += [Case(p, "dspark", b, policy=p) for p in ("fixed", "auto") for b in batches]
    if 1 in batches:
        cases += [
            Case("auto-nodraft", "dspark", 1, policy="auto", drafts="wrong", only_plain_rounds=True),
            Case("stock", "stock", 1),
        ]
    return cases


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64], help="batch sizes (default 1 8 64).")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per row (default 64).")
    parser.add_argument("--gamma", type=int, default=4, help="the oracle's block size γ (default 4).")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs of every case (default 7).")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, pinned for the run (default 1).")
    # fmt: off
    parser.add_argument("--layers", type=int, default=4, help="layers of the tiny random Llama (default 4; >= 4).")
    parser.add_argument("--code-root", type=Path, default=os.environ.get("LOOP_OVERHEAD_CODE_ROOT"),
                        help="time the hf-dspark of this checkout (its src/) instead of the installed one "
                             "(default: $LOOP_OVERHEAD_CODE_ROOT, else this repository's).")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON report path (default: benchmarks/results/<processor kind>/loop_overhead.json).")
    parser.add_argument("--before", type=Path, default=None,
                        help="another report of this benchmark: also print a side-by-side table.")
    # fmt: on
    parser.add_argument("--worker-out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("new_tokens", "gamma", "repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.layers < 4:
        parser.error(f"--layers must be at least 4 (the drafter taps layers 1..L-3), got {args.layers}")
    if any(b < 1 for b in args.batches):
        parser.error(f"--batches must be positive, got {args.batches}")
    if args.new_tokens < 2 * (args.gamma + 1):
        parser.error(f"--new-tokens must be at least 2·(γ + 1) = {2 * (args.gamma + 1)} for two rounds")
    if args.code_root is not None and not (Path(args.code_root) / "src" / "hf_dspark").is_dir():
        parser.error(f"--code-root {args.code_root}: no src/hf_dspark there (pass a checkout of this project)")
    if args.before is not None and not args.before.is_file():
        parser.error(f"--before {args.before}: no such file")
    return args


# ---------------------------------------------------------------------------- the model and the prompts
def build_target(layers: int, seed: int = 0):
    torch.manual_seed(seed)
    shape = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=96)
    config = LlamaConfig(**shape, num_hidden_layers=layers, max_position_embeddings=512, eos_token_id=None)
    target = LlamaForCausalLM(config).eval()
    target.generation_config.eos_token_id = None
    target.generation_config.pad_token_id = 0
    return target


def prompts(batch: int, vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ragged prompts `[B, L]` and their mask (batch 1: one unpadded prompt)."""
    gen = torch.Generator().manual_seed(seed + batch)
    low, high = PROMPT_LENGTHS
    sizes = [24] if batch == 1 else torch.randint(low, high + 1, (batch,), generator=gen).tolist()
    width = max(sizes)
    ids = torch.zeros(batch, width, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for row, n in enumerate(sizes):
        ids[row, width - n :] = torch.randint(3, vocab, (n,), generator=gen)
        mask[row, width - n :] = 1
    return ids, mask


# ---------------------------------------------------------------------------- timing
class Timeline:
    """Target forwards `(start, end, tokens per row)` from hooks and drafter calls `(start, end)` from wrappers."""

    def __init__(self) -> None:
        self.forwards: list[tuple[float, float, int]] = []
        self.drafts: list[tuple[float, float]] = []
        self._start = 0.0
        self._width = 0

    def pre(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        self._width = int(ids.shape[-1]) if ids is not None else 0
        self._start = time.perf_counter()

    def post(self, module, args, kwargs, output) -> None:
        self.forwards.append((self._start, time.perf_counter(), self._width))

    def wrap(self, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.drafts.append((start, time.perf_counter()))

        return timed

    def rounds(self, only_plain: bool) -> dict:
        """Per-round means (seconds) over the gaps between forwards 2..n (the gap after prefill left out)."""
        gaps, forward_s, draft_s = [], [], []
        for prev, nxt in zip(self.forwards[1:], self.forwards[2:]):
            if only_plain and nxt[2] != 1:
                continue
            inside = sum(e - s for s, e in self.drafts if s >= prev[1] and e <= nxt[0])
            gaps.append(nxt[0] - prev[1] - inside)
            forward_s.append(nxt[1] - nxt[0])
            draft_s.append(inside)
        if not gaps:
            return {"rounds": 0}
        return {"rounds": len(gaps), "overhead_s": statistics.fmean(gaps), "forward_s": statistics.fmean(forward_s),
                "drafter_s": statistics.fmean(draft_s), "forwards": len(self.forwards)}  # fmt: skip


class OracleCandidates(CandidateGenerator):
    """A candidate generator for transformers' batch-1 assisted loop that returns the oracle's drafts."""

    def __init__(self, reference: torch.Tensor, gamma: int, max_length: int) -> None:
        self.reference, self.gamma, self.max_length = reference, gamma, max_length
        self.num_drafting_tokens = gamma

    def get_candidates(self, input_ids: torch.Tensor, **kwargs):
        length = input_ids.shape[1]
        count = min(self.gamma, self.max_length - length - 1)
        if count <= 0:
            return input_ids, None
        return torch.cat([input_ids, self.reference[None, length : length + count]], dim=1), None

    def update_candidate_strategy(self, input_ids, scores, num_matches) -> None:
        pass


def step_curve():
    """A synthetic SPS(B) for `auto` (no profiling inside the benchmark): 1 ms + 20 µs per token."""
    from hf_dspark.profiling.step_curve import StepCurve

    tokens = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    return StepCurve(tokens, [1.0 / (1e-3 + 2e-5 * b) for b in tokens], model="tiny-random-llama")


# ---------------------------------------------------------------------------- one run of one case
def run_case(case: Case, target, inputs: dict, args) -> tuple[Timeline, bool]:
    from hf_dspark.generation import oracle_for

    ids, mask, reference = inputs[case.batch]
    timeline = Timeline()
    common = dict(attention_mask=mask, do_sample=False, max_new_tokens=args.new_tokens)
    drafter = None
    if case.method == "dspark":
        drafter = oracle_for(target, args.gamma, reference, mask)
        if case.drafts == "wrong":
            drafter.reference = [(r + 1) % target.config.vocab_size for r in drafter.reference]
        for name in ("propose", "extend_context"):
            if hasattr(drafter, name):
                setattr(drafter, name, timeline.wrap(getattr(drafter, name)))
        common.update(assistant_model=drafter, dspark_policy=case.policy)
        if case.policy == "auto":
            common.update(dspark_step_curve=step_curve())
    elif case.method == "stock":
        generator = OracleCandidates(reference[0], args.gamma, ids.shape[1] + args.new_tokens)
        generator.get_candidates = timeline.wrap(generator.get_candidates)
        target._get_candidate_generator = lambda *a, **k: generator
        common.update(prompt_lookup_num_tokens=args.gamma)
    hooks = [
        target.register_forward_pre_hook(timeline.pre, with_kwargs=True),
        target.register_forward_hook(timeline.post, with_kwargs=True),
    ]
    gc.collect()
    try:
        with torch.no_grad():
            output = target.generate(ids, **common)
    finally:
        for hook in hooks:
            hook.remove()
        vars(target).pop("_get_candidate_generator", None)
    return timeline, bool(output.shape == reference.shape and torch.equal(output, reference))


def measure(args) -> dict:
    """Every case, interleaved over `args.repeats` (after one warm-up run each): the raw per-repeat numbers."""
    torch.set_num_threads(args.threads)
    target = build_target(args.layers)
    inputs = {}
    for batch in sorted(set(args.batches)):
        ids, mask = prompts(batch, target.config.vocab_size)
        with torch.no_grad():
            reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=args.new_tokens)
        inputs[batch] = (ids, mask, reference)
    cases = cases_for(args.batches)
    raw = {c.key: {"case": c.name, "batch": c.batch, "runs": [], "identical": True, "error": None} for c in cases}
    for repeat in range(args.repeats + 1):  # repeat 0 is the warm-up
        shift = repeat % len(cases)
        for case in cases[shift:] + cases[:shift]:
            entry = raw[case.key]
            if entry["error"] is not None:
                continue
            try:
                timeline, identical = run_case(case, target, inputs, args)
            except Exception as error:  # an older checkout may lack an option: record it, keep the others
                entry["error"] = f"{type(error).__name__}: {error}"
                continue
            if repeat:
                entry["runs"].append(timeline.rounds(case.only_plain_rounds))
                entry["identical"] = entry["identical"] and identical
        print(f"repeat {repeat}/{args.repeats} done", file=sys.stderr, flush=True)
    return {"threads": torch.get_num_threads(), "raw": raw}


# ---------------------------------------------------------------------------- entry point
def _measure_in_worker(args, argv: list[str]) -> dict:
    """Run `measure` under another checkout's `src/` in a child process (its `hf_dspark` may differ)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "raw.json"
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(
                [str(Path(args.code_root).resolve() / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
        )
        env.pop("LOOP_OVERHEAD_CODE_ROOT", None)
        keep = _without_option(argv, ("--code-root", "--out", "--before"))
        subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), *keep, "--worker-out", str(out)], env=env, check=True
        )
        return json.loads(out.read_text())


def _without_option(argv: list[str], names: tuple[str, ...]) -> list[str]:
    kept, skip = [], False
    for item in argv:
        if skip:
            skip = False
        elif item in names:
            skip = True
        elif not any(item.startswith(f"{n}=") for n in names):
            kept.append(item)
    return kept


def _relative_paths(argv: list[str]) -> list[str]:
    """The command line with absolute paths written relative to the repository (a record names no machine)."""
    return [os.path.relpath(item, ROOT) if os.path.isabs(item) else item for item in argv]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker_out is not None:  # child process: measure only (no provenance module in older checkouts)
        args.worker_out.write_text(json.dumps(measure(args)))
        return 0
    from hf_dspark.io_utils import write_json_atomic
    from hf_dspark.provenance import git_state, processor_kind, result_provenance

    foreign = args.code_root is not None and Path(args.code_root).resolve() != ROOT
    measured = _measure_in_worker(args, argv) if foreign else measure(args)
    code_root = Path(args.code_root).resolve() if foreign else ROOT
    commit, dirty = git_state(code_root)
    rows, ratios = summarize(measured["raw"], args.batches)
    code = {"root": os.path.relpath(code_root, ROOT), "git_commit": commit, "dirty": dirty}
    report = {"benchmark": "loop_overhead", "code": code,
              "threads": measured["threads"], "batches": args.batches, "new_tokens": args.new_tokens,
              "gamma": args.gamma, "repeats": args.repeats, "layers": args.layers, "cases": rows,
              "ratios": ratios}  # fmt: skip
    name = f"loop_overhead.{(commit or 'unknown')[:7]}.json" if foreign else "loop_overhead.json"
    out = args.out or ROOT / "benchmarks" / "results" / processor_kind() / name
    command = ["python", "benchmarks/loop_overhead.py", *_relative_paths(argv)]
    provenance = result_provenance(command=command, cwd=ROOT)
    report["provenance"] = {**provenance, "threads": measured["threads"]}  # the measuring process's threads
    write_json_atomic(out, report)
    print(markdown(rows, ratios))
    if args.before is not None:
        print("\n" + before_after(json.loads(args.before.read_text()), report))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
