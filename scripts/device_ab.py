"""The speed A/B of `scripts/device_check.py`: hf-dspark against plain and stock decoding on one device.

Random-init targets of real shape (Llama-3.2-1B and Llama-3.1-8B in bf16 on an accelerator; a tiny Llama on a CPU),
128-token prompts, `eos_token_id=None`, greedy. Methods, at each batch:

- `plain`: eager plain `generate`; `plain-static-compile`: plain `generate` with a static cache and
  `compile_config` (static cache only where compiling is off, e.g. on a CPU by default);
- `stock-oracle` / `stock-noisy` (batch 1): transformers' own assisted loop fed the same drafts by a candidate
  generator;
- `oracle-fixed` (the ceiling: every draft right), `noisy-fixed` and `noisy-auto` (a noisy oracle whose first wrong
  draft is geometric, τ ≈ 3.5, ragged over rows), `untrained-fixed` (an untrained DSpark drafter of the target's real
  shape), `oracle-fixed-static-compile` (hf-dspark asked for a static cache and compiling: "refused" with the reason
  when it declines).

Per run: tokens/s (median of `--repeats`, device synchronised around each run), rounds, ms per round split into
verify and draft (an instrumented run whose hooks synchronise the device), host-device sync points per round
(`torch.cuda.set_sync_debug_mode` on CUDA, `hf_dspark.diagnostics.SyncCounter` elsewhere), the GPU-busy fraction
from `torch.profiler` (CUDA only) and whether the output equals eager plain greedy `generate`. A time guard skips
what would run past the deadline and lists it.
"""

from __future__ import annotations

import math
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

# fmt: off
ROPE_8K = {"rope_type": "llama3", "rope_theta": 500000.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192}
LLAMA_3_2_1B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                    num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=131072,
                    tie_word_embeddings=True, rms_norm_eps=1e-5, rope_parameters={**ROPE_8K, "factor": 32.0},
                    bos_token_id=128000, eos_token_id=None, pad_token_id=128004)
LLAMA_3_1_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                    num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072,
                    tie_word_embeddings=False, rms_norm_eps=1e-5, rope_parameters={**ROPE_8K, "factor": 8.0},
                    bos_token_id=128000, eos_token_id=None, pad_token_id=128004)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=96, max_position_embeddings=512, bos_token_id=1, eos_token_id=None, pad_token_id=0)
AB_SHAPES = {"llama-3.2-1b": LLAMA_3_2_1B, "llama-3.1-8b": LLAMA_3_1_8B, "tiny": TINY}
METHODS = ("plain", "plain-static-compile", "stock-oracle", "stock-noisy", "oracle-fixed", "noisy-fixed",
           "noisy-auto", "untrained-fixed", "oracle-fixed-static-compile")
# fmt: on
BATCH_ONE_ONLY = ("stock-oracle", "stock-noisy")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type != "cpu" and hasattr(torch, "accelerator") and torch.accelerator.is_available():
        torch.accelerator.synchronize()


def acceptance_for(tau: float, gamma: int) -> float:
    """p with E[τ] = 1 + Σ_{k=1..γ} p^k = tau (each draft right with probability p until the first wrong one)."""
    if not 1.0 < tau < gamma + 1:
        raise ValueError(f"tau must lie in (1, γ + 1) = (1, {gamma + 1}), got {tau}")
    low, high = 0.0, 1.0
    for _ in range(60):
        p = (low + high) / 2
        low, high = (p, high) if 1 + sum(p**k for k in range(1, gamma + 1)) < tau else (low, p)
    return (low + high) / 2


@dataclass
class Noise:
    """Corrupts drafts `[R, γ]` on their device: row r's first wrong draft sits at a geometric position."""

    p: float
    vocab: int
    seed: int = 0
    generator: torch.Generator | None = None

    def reset(self) -> None:
        self.generator = None

    def __call__(self, drafts: torch.Tensor) -> torch.Tensor:
        if self.generator is None:
            self.generator = torch.Generator(device=drafts.device).manual_seed(self.seed)
        u = torch.rand(drafts.shape[0], 1, device=drafts.device, generator=self.generator).clamp_min(1e-12)
        first_wrong = torch.floor(torch.log(u) / math.log(self.p))  # P(k) = p^k (1 - p)
        columns = torch.arange(drafts.shape[1], device=drafts.device)[None, :]
        return torch.where(columns == first_wrong, (drafts + 1) % self.vocab, drafts)


def noisy(drafter, noise: Noise):
    """`drafter` whose proposals pass through `noise` (the oracle's lookup, then the corruption)."""
    propose = drafter.propose

    def noisy_propose(*args, **kwargs):
        proposal = propose(*args, **kwargs)
        proposal.draft_ids = noise(proposal.draft_ids)
        return proposal

    drafter.propose = noisy_propose
    return drafter


def stock_candidates(reference: torch.Tensor, gamma: int, max_length: int, noise: Noise | None):
    """A batch-1 candidate generator for transformers' assisted loop returning the oracle's (noisy) drafts."""
    from transformers.generation.candidate_generator import CandidateGenerator

    class OracleCandidates(CandidateGenerator):
        num_drafting_tokens = gamma

        def get_candidates(self, input_ids, **kwargs):
            length = input_ids.shape[1]
            count = min(gamma, max_length - length - 1)
            if count <= 0:
                return input_ids, None
            drafts = reference[None, length : length + count]
            return torch.cat([input_ids, noise(drafts) if noise is not None else drafts], dim=1), None

        def update_candidate_strategy(self, input_ids, scores, num_matches):
            pass

    return OracleCandidates()


@dataclass
class Setting:
    """One A/B point's fixed inputs."""

    target: torch.nn.Module
    ids: torch.Tensor
    mask: torch.Tensor
    reference: torch.Tensor
    new_tokens: int
    gamma: int
    tau: float
    compile: bool
    extra: dict = field(default_factory=dict)


def make_run(method: str, s: Setting) -> tuple[Callable[[], torch.Tensor], object | None, Noise | None]:
    """(one generate call, the drafter to instrument or None, the noise to reset before each call or None)."""
    from transformers import CompileConfig

    from hf_dspark import DSparkConfig, DSparkDrafter
    from hf_dspark.generation import oracle_for

    target, vocab = s.target, s.target.config.vocab_size
    common = dict(attention_mask=s.mask, do_sample=False, max_new_tokens=s.new_tokens)
    static = dict(cache_implementation="static", **({"compile_config": CompileConfig()} if s.compile else {}))
    noise = Noise(acceptance_for(s.tau, s.gamma), vocab) if "noisy" in method else None
    drafter = None
    if method.startswith("plain"):
        common.update(static if method.endswith("static-compile") else {})
    elif method.startswith("stock"):
        generator = stock_candidates(s.reference[0], s.gamma, s.ids.shape[1] + s.new_tokens, noise)
        common.update(prompt_lookup_num_tokens=s.gamma, _candidates=generator)
        drafter = generator  # its get_candidates is the drafting time
    elif method == "untrained-fixed":
        torch.manual_seed(1)
        config = DSparkConfig.from_target(target.config, block_size=s.gamma)
        with torch.device(target.device):
            drafter = DSparkDrafter(config)
        drafter = drafter.to(target.dtype).eval().bind_target(target)
    else:
        drafter = oracle_for(target, s.gamma, s.reference, s.mask)
        drafter = noisy(drafter, noise) if noise is not None else drafter
    if drafter is not None and not method.startswith("stock"):
        policy = method.split("-")[1]
        common.update(assistant_model=drafter, dspark_policy=policy, **s.extra.get(policy, {}))
        common.update(static if method.endswith("static-compile") else {})

    def run() -> torch.Tensor:
        if noise is not None:
            noise.reset()
        kwargs = dict(common)
        candidates = kwargs.pop("_candidates", None)
        if candidates is not None:
            target._get_candidate_generator = lambda *a, **k: candidates
        try:
            with torch.no_grad():
                return target.generate(s.ids, **kwargs)
        finally:
            vars(target).pop("_get_candidate_generator", None)

    return run, drafter, noise


class Split:
    """Verify (target forwards after the prefill) and draft (drafter calls) seconds, device-synchronised."""

    def __init__(self, target, drafter, device: torch.device, prefill_verifies: bool = False) -> None:
        self.target, self.drafter, self.device = target, drafter, device
        self.prefill_verifies = prefill_verifies  # the stock loop verifies its first drafts in the prefill forward
        self.forwards: list[float] = []
        self.draft_s = 0.0
        self._start = 0.0

    def _pre(self, *_):
        synchronize(self.device)
        self._start = time.perf_counter()

    def _post(self, *_):
        synchronize(self.device)
        self.forwards.append(time.perf_counter() - self._start)

    def _wrap(self, fn):
        def timed(*args, **kwargs):
            synchronize(self.device)
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            synchronize(self.device)
            self.draft_s += time.perf_counter() - start
            return out

        return timed

    def measure(self, run: Callable[[], torch.Tensor]) -> dict:
        hooks = [self.target.register_forward_pre_hook(self._pre), self.target.register_forward_hook(self._post)]
        saved = {}
        for name in ("propose", "extend_context", "get_candidates"):
            if self.drafter is not None and hasattr(self.drafter, name):
                saved[name] = vars(self.drafter).get(name)
                setattr(self.drafter, name, self._wrap(getattr(self.drafter, name)))
        try:
            run()
        finally:
            for hook in hooks:
                hook.remove()
            for name, previous in saved.items():
                if previous is None:
                    vars(self.drafter).pop(name, None)
                else:
                    setattr(self.drafter, name, previous)
        verifies = self.forwards[1:]  # the first forward holds the prompt (and, in the stock loop, a verification)
        rounds = max(len(self.forwards) - (0 if self.prefill_verifies else 1), 1)
        return {
            "rounds": rounds,
            "verify_ms_per_round": 1e3 * sum(verifies) / max(len(verifies), 1),
            "draft_ms_per_round": 1e3 * self.draft_s / rounds,
        }


def count_syncs(run: Callable[[], torch.Tensor], s: Setting, drafter) -> int:
    """Host-device sync points of one call: CUDA's sync debug mode, else `SyncCounter` (the CPU proxy)."""
    device = s.ids.device
    if device.type == "cuda":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                run()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in caught)
    from hf_dspark.diagnostics import SyncCounter

    roots = [s.target, s.ids, s.mask, s.reference]
    roots += [drafter] if isinstance(drafter, torch.nn.Module) else []
    roots += list(getattr(drafter, "reference", None) or [])  # the oracle's references live on the device
    with SyncCounter(*roots) as counter:
        run()
    return counter.total


def busy_fraction(run: Callable[[], torch.Tensor], device: torch.device) -> float | None:
    """Share of one call's wall time the GPU spent in kernels (`torch.profiler`); None off CUDA."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        run()
        synchronize(device)
        wall_us = 1e6 * (time.perf_counter() - start)
    busy = busy_microseconds(prof.events())
    return min(busy / wall_us, 1.0) if wall_us > 0 else None


def busy_microseconds(events) -> float:
    """Length of the union of the device events' time ranges (kernels, copies; overlaps counted once)."""
    from torch.autograd import DeviceType

    spans = sorted((e.time_range.start, e.time_range.end) for e in events if e.device_type != DeviceType.CPU)
    total, end = 0.0, float("-inf")
    for start, stop in spans:
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def measure_method(method: str, s: Setting, repeats: int) -> dict:
    """Every number of one (method, batch) row; `refused` (hf-dspark declined an option) or `error` with the reason
    when a call raises."""
    device = s.ids.device
    row: dict = {"method": method, "batch": s.ids.shape[0]}
    try:
        run, drafter, _ = make_run(method, s)
        synchronize(device)
        start = time.perf_counter()
        run()  # warm-up (compiles, autotunes)
        synchronize(device)
        row["warmup_s"] = time.perf_counter() - start
    except Exception as error:  # a declined option is a result, not a crash
        key = "refused" if method == "oracle-fixed-static-compile" else "error"
        return {**row, key: f"{type(error).__name__}: {error}"}
    try:
        _measure(row, method, s, repeats, run, drafter)
    except Exception as error:  # keep what was measured
        row["error"] = f"{type(error).__name__}: {error}"
    return row


def _measure(row: dict, method: str, s: Setting, repeats: int, run, drafter) -> None:
    device, batch = s.ids.device, s.ids.shape[0]
    seconds, output = [], None
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        output = run()
        synchronize(device)
        seconds.append(time.perf_counter() - start)
    wall = statistics.median(seconds)
    row["tokens_per_second"] = batch * s.new_tokens / wall
    row["identical_to_plain"] = bool(output.shape == s.reference.shape and torch.equal(output, s.reference))
    if method.startswith("plain"):
        row.update(rounds=s.new_tokens, verify_ms_per_round=None, draft_ms_per_round=None)
    else:
        stock = method.startswith("stock")
        row.update(Split(s.target, drafter, device, prefill_verifies=stock).measure(run))
    row["ms_per_round"] = 1e3 * wall / row["rounds"]
    after_prefill = s.new_tokens - (0 if method.startswith(("plain", "stock")) else 1)  # hf-dspark: 1 from prefill
    row["tokens_per_round"] = after_prefill / row["rounds"]
    row["syncs_per_round"] = count_syncs(run, s, drafter) / row["rounds"]
    row["gpu_busy_fraction"] = busy_fraction(run, device)


def _fmt(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


COLUMNS = (  # (header, key, format) of the summary table
    ("tok/s", "tokens_per_second", ".1f"),
    ("× plain", "speedup_vs_plain", ".2f"),
    ("× static", "speedup_vs_static", ".2f"),
    ("× stock", "speedup_vs_stock", ".2f"),
    ("ms/round", "ms_per_round", ".2f"),
    ("verify ms", "verify_ms_per_round", ".2f"),
    ("draft ms", "draft_ms_per_round", ".2f"),
    ("tok/round", "tokens_per_round", ".2f"),
    ("syncs/round", "syncs_per_round", ".1f"),
    ("GPU busy", "gpu_busy_fraction", ".0%"),
)


def row_line(row: dict) -> str:
    """One finished row, as printed while the A/B runs."""
    head = f"A/B {row['shape']:12s} batch {row['batch']:3d} {row['method']:27s}"
    note = row.get("refused") or row.get("error")
    if "tokens_per_second" not in row:
        return f"{head} {'REFUSED' if 'refused' in row else 'ERROR'}: {note}"
    same = {True: "identical", False: "DIFFERS", None: ""}[row.get("identical_to_plain")]
    numbers = "  ".join(f"{name} {_fmt(row.get(key), spec)}" for name, key, spec in COLUMNS if key in row)
    return f"{head} {numbers}  {same}" + (f"  ERROR: {note}" if note else "")


def summary_table(rows: list[dict]) -> str:
    """The A/B as a markdown table (refused and failed rows say so)."""
    lines = [
        "| shape | batch | method | " + " | ".join(c[0] for c in COLUMNS) + " | = plain |",
        "| --- | ---: | --- |" + " ---: |" * len(COLUMNS) + " --- |",
    ]
    for r in rows:
        if "tokens_per_second" not in r:
            cells = ["refused" if "refused" in r else "error"] + [""] * len(COLUMNS)
        else:
            same = r.get("identical_to_plain")
            cells = [_fmt(r.get(key), spec) for _, key, spec in COLUMNS] + [
                "–" if same is None else "yes" if same else "no"
            ]
        lines.append(f"| {r['shape']} | {r['batch']} | {r['method']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
