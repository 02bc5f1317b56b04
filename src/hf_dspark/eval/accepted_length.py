"""Offline accepted length (`hf-dspark eval`): τ per prompt set and drafter with the scheduler off (fixed ℓ).

Every drafter runs inside the same batched DSpark loop (`target.generate(..., assistant_model=drafter)`) with
`dspark_policy="fixed"`, so τ isolates draft quality. A round observer (`ProposalRecorder`) records each
round's raw confidence logits; with the loop's per-round stats and the final sequences that gives,
per row and round, `[ℓ, m, c]` (see `acceptance_metrics`). Multi-turn items are played turn by turn with the
model's own earlier replies. Per-(drafter, ℓ, set, prompt, turn) records are appended to a JSON Lines work file
next to the output, so an interrupted run resumes where it stopped. `eval_report.build_report` turns the
records into the JSON report and `plots` draws the figures.
"""

from __future__ import annotations

import copy
import hashlib
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig
from transformers.utils import logging

from ..drafter import DSparkDrafter
from ..generation import prompt_lookup_for
from ..io_utils import check_replaceable
from ..profiling.target_steps import cache_root
from ..provenance import processor_kind
from .prompts import chat_input_ids, check_output_path, check_prompt_files, load_prompt_set, set_names
from .work_file import WorkFile, drafter_identity, target_identity

logger = logging.get_logger(__name__)

PROMPT_LOOKUP = "prompt_lookup"
EVAL_REPORT_KEYS = ("config", "table")  # keys of every `hf-dspark eval` report (`build_report`)


@dataclass
class EvalConfig:
    """Args:
    sets: JSONL prompt sets (`{"turns": [...]}` per line); a set's name is its file stem (with parent folders when
        two files share a stem: `a/chat`, `b/chat`).
    temperature: 1.0 samples (top-k/top-p off); 0 decodes greedily.
    block_size: ℓ = γ for the main table (capped at each drafter's block size); None = each drafter's own.
    sweep_gammas: proposal lengths of the γ sweep (a drafter proposing fewer positions is skipped there).
    prompt_lookup: add the prompt-lookup drafter (any γ) next to the given drafters.
    limit: prompts per set, >= 1 (None: all).
    max_new_tokens: tokens generated per turn.
    batch_size: prompts per generate call (τ is per row either way).
    seed: base seed of the sampling runs.
    threads: torch threads, pinned for the whole run.
    out: JSON report path (default `benchmarks/results/<processor kind>/eval.json`, this CPU's kind); figures
        `<stem>_*.png` go beside it. It may not be a prompt file, nor an existing file other than an earlier report
        unless `overwrite`.
    work_file: the resumable record of every finished prompt (JSONL). None: `<stem>-<digest of out>.work.jsonl`
        under `eval/` in the user cache (`$HF_DSPARK_CACHE`, else `~/.cache/hf_dspark`), so that it stays out of
        a results folder kept in git.
    resume: reuse the records of the work file (False starts it afresh). A record is reused only when the settings
        (`fingerprint`) and the drafter's weights and config (`drafter_identity`) match.
    overwrite: replace an existing `out` that is not an `hf-dspark eval` report.
    """

    sets: list[str] = field(default_factory=list)
    temperature: float = 1.0
    block_size: int | None = None
    sweep_gammas: list[int] = field(default_factory=lambda: [4, 8, 12, 16])
    prompt_lookup: bool = False
    limit: int | None = None
    max_new_tokens: int = 256
    batch_size: int = 4
    seed: int = 0
    threads: int = 2
    out: str = field(default_factory=lambda: f"benchmarks/results/{processor_kind()}/eval.json")
    work_file: str | None = None
    resume: bool = True
    overwrite: bool = False

    def __post_init__(self) -> None:
        check_prompt_files(self.sets)
        set_names(self.sets)  # refuses a file given twice
        if self.temperature < 0 or self.max_new_tokens < 1 or self.batch_size < 1:
            raise ValueError("temperature must be >= 0, max_new_tokens and batch_size >= 1")
        if (self.block_size is not None and self.block_size < 1) or any(g < 1 for g in self.sweep_gammas):
            raise ValueError("block sizes must be >= 1")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit (prompts per set) must be >= 1, got {self.limit}; omit it to use every prompt.")
        if Path(self.out).is_dir():
            raise ValueError(f"--out {self.out} is a folder; give the report's file path, e.g. {self.out}/eval.json.")
        check_output_path(self.out, self.sets)
        check_output_path(self.work_path, self.sets, what="the work file of --out")
        check_replaceable(self.out, EVAL_REPORT_KEYS, "an hf-dspark eval report", self.overwrite)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def fingerprint(self) -> str:
        """What must match for a work-file record to be reused."""
        return f"T={self.temperature:g}|new={self.max_new_tokens}|seed={self.seed}"

    @property
    def work_path(self) -> Path:
        """`work_file`, or its default place in the user cache (see `work_file`)."""
        if self.work_file is not None:
            return Path(self.work_file)
        digest = hashlib.sha256(str(Path(self.out).resolve()).encode("utf-8")).hexdigest()[:12]
        return cache_root() / "eval" / f"{Path(self.out).stem}-{digest}.work.jsonl"


@dataclass
class Plan:
    """One (drafter, ℓ) run over every set; `role` is "main" (the table) or "sweep"."""

    name: str
    drafter: DSparkDrafter
    verify_len: int
    role: str


# ---------------------------------------------------------------------------------------------- recording
@dataclass
class ProposalCall:
    rows: list[int]
    confidence_logits: torch.Tensor | None  # [A, γ]


class ProposalRecorder:
    """A round observer (`dspark_observers=[recorder]`) keeping each drafting round's rows and confidence logits."""

    def __init__(self) -> None:
        self.calls: list[ProposalCall] = []

    def on_round(self, record) -> None:
        logits = record.confidence_logits
        self.calls.append(ProposalCall(list(record.rows), None if logits is None else logits.float().cpu()))


def rounds_from_generation(stats, calls: list[ProposalCall], sequences: torch.Tensor, prompt_width: int):
    """Per row: (rounds `[[ℓ, m, c], ...]`, confidence logits per round or None, new-token count).

    stats: the call's `DSparkGenerationStats` (ℓ, accepted drafts m and committed tokens c per row and round);
    calls: the recorded rounds (`ProposalRecorder.calls`); sequences: the generate output `[B, prompt_width + T]`.
    The first new token of every row comes from the prefill. A row's logits are kept only when every one of its
    rounds drafted (a plain-decoding round has none).
    """
    if len(calls) != stats.rounds or len(stats.accepted_drafts) != stats.rounds:
        raise RuntimeError(
            f"recorded {len(calls)} rounds and {len(stats.accepted_drafts)} acceptance counts for "
            f"{stats.rounds} rounds"
        )
    out = []
    for row in range(sequences.shape[0]):
        position, rounds, logits = 1, [], []
        for call, lens, committed, accepted in zip(
            calls, stats.verify_lens, stats.accepted_lengths, stats.accepted_drafts
        ):
            if row not in lens:
                continue
            count = committed[row]
            rounds.append([lens[row], accepted[row], count])
            row_logits = None if call.confidence_logits is None else call.confidence_logits[call.rows.index(row)]
            if row_logits is not None and bool(torch.isfinite(row_logits).all()):  # NaN: the row did not draft
                logits.append([round(float(z), 4) for z in row_logits])
            position += count
        out.append((rounds, logits if len(logits) == len(rounds) else None, position))
    return out


# ---------------------------------------------------------------------------------------------- generation
def generation_config_for(target, config: EvalConfig, verify_len: int, pad_token_id: int) -> GenerationConfig:
    """Plain sampling at `temperature` (top-k/top-p off) or greedy, DSpark fixed ℓ = `verify_len`."""
    sampling = (
        dict(do_sample=False)
        if config.greedy
        else dict(do_sample=True, temperature=config.temperature, top_k=0, top_p=1.0)
    )
    eos = target.generation_config.eos_token_id
    generation = GenerationConfig(
        max_new_tokens=config.max_new_tokens, eos_token_id=eos, pad_token_id=pad_token_id, **sampling
    )
    generation.dspark_policy = "fixed"
    generation.dspark_verify_len = verify_len
    return generation


def _left_pad(prompts: list[torch.Tensor], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(p.shape[-1] for p in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for r, prompt in enumerate(prompts):
        ids[r, width - prompt.shape[-1] :] = prompt.reshape(-1)
        mask[r, width - prompt.shape[-1] :] = 1
    return ids, mask


def generate_rows(
    target, tokenizer, plan: Plan, prompts: list[torch.Tensor], generation: GenerationConfig, seed: int
) -> list[dict]:
    """One batched DSpark generate call; returns a partial record per prompt (rounds, logits, reply...)."""
    ids, mask = _left_pad(prompts, generation.pad_token_id)
    torch.manual_seed(seed)
    start = time.perf_counter()
    recorder = ProposalRecorder()
    generation = copy.deepcopy(generation)
    generation.dspark_observers = [recorder]
    sequences = target.generate(
        ids.to(target.device),
        attention_mask=mask.to(target.device),
        generation_config=generation,
        assistant_model=plan.drafter,
    )
    seconds = time.perf_counter() - start
    rows = rounds_from_generation(plan.drafter.last_generation_stats, recorder.calls, sequences.cpu(), ids.shape[1])
    records = []
    for row, (rounds, logits, new_tokens) in enumerate(rows):
        reply_ids = sequences[row, ids.shape[1] : ids.shape[1] + new_tokens]
        records.append(
            dict(
                rounds=rounds,
                confidence_logits=logits,
                new_tokens=new_tokens,
                reply=tokenizer.decode(reply_ids, skip_special_tokens=True).strip(),
                seconds=seconds / len(prompts),
            )
        )
    return records


def _seed(config: EvalConfig, *parts) -> int:
    return zlib.crc32("|".join(str(p) for p in (config.seed, *parts)).encode()) & 0x7FFFFFFF


def _pending_turns(work: WorkFile, plan: Plan, set_name: str, items: list[dict]) -> int:
    return sum(
        work.get(plan.name, plan.verify_len, set_name, i, t) is None
        for i, item in enumerate(items)
        for t in range(len(item["turns"]))
    )


def run_plan_on_set(
    plan: Plan, set_name: str, items: list[dict], target, tokenizer, config: EvalConfig, work: WorkFile
) -> None:
    """Play every pending (prompt, turn) of a set with one drafter at ℓ, in batches, turn by turn."""
    pending = _pending_turns(work, plan, set_name, items)
    if not pending:
        return
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    generation = generation_config_for(target, config, plan.verify_len, pad)
    bar = tqdm(total=pending, desc=f"{plan.name} ℓ={plan.verify_len} {set_name}", unit="turn")
    for start in range(0, len(items), config.batch_size):
        batch = range(start, min(start + config.batch_size, len(items)))
        for turn in range(max(len(items[i]["turns"]) for i in batch)):
            todo = [
                i
                for i in batch
                if turn < len(items[i]["turns"]) and work.get(plan.name, plan.verify_len, set_name, i, turn) is None
            ]
            if not todo:
                continue
            prompts = []
            for i in todo:
                replies = [work.get(plan.name, plan.verify_len, set_name, i, t)["reply"] for t in range(turn)]
                prompts.append(chat_input_ids(tokenizer, items[i]["turns"][: turn + 1], replies))
            seed = _seed(config, plan.name, plan.verify_len, set_name, todo[0], turn)
            for i, record in zip(todo, generate_rows(target, tokenizer, plan, prompts, generation, seed)):
                work.append(
                    dict(
                        drafter=plan.name,
                        verify_len=plan.verify_len,
                        role=plan.role,
                        set=set_name,
                        prompt=i,
                        turn=turn,
                        call=todo,
                        **record,
                    )
                )
            bar.update(len(todo))
    bar.close()


# ---------------------------------------------------------------------------------------------- plans
def make_plans(config: EvalConfig, target, drafters: dict[str, DSparkDrafter]) -> tuple[list[Plan], dict]:
    """Main runs first, then the γ sweep; returns (plans, {drafter: [skipped sweep γ]})."""
    own = [d.config.block_size for d in drafters.values()]
    main_pl = config.block_size or (max(own) if own else 7)
    lookups: dict[int, DSparkDrafter] = {}

    def lookup(gamma: int) -> DSparkDrafter:
        if gamma not in lookups:
            lookups[gamma] = prompt_lookup_for(target, gamma)
        return lookups[gamma]

    plans = [
        Plan(n, d, min(config.block_size or d.config.block_size, d.config.block_size), "main")
        for n, d in drafters.items()
    ]
    if config.prompt_lookup:
        plans.append(Plan(PROMPT_LOOKUP, lookup(main_pl), main_pl, "main"))
    skipped: dict[str, list[int]] = {}
    done = {(p.name, p.verify_len) for p in plans}
    for gamma in config.sweep_gammas:
        for name, drafter in drafters.items():
            if gamma > drafter.config.block_size:
                skipped.setdefault(name, []).append(gamma)
            elif (name, gamma) not in done:
                plans.append(Plan(name, drafter, gamma, "sweep"))
        if config.prompt_lookup and (PROMPT_LOOKUP, gamma) not in done:
            plans.append(Plan(PROMPT_LOOKUP, lookup(gamma), gamma, "sweep"))
        done |= {(p.name, p.verify_len) for p in plans}
    return plans, skipped


def load_sets(config: EvalConfig) -> dict[str, list[dict]]:
    """{set name: items} (names from `prompts.set_names`), the first `config.limit` items of each file."""
    return {name: load_prompt_set(path)[: config.limit] for name, path in zip(set_names(config.sets), config.sets)}


def run_eval(config: EvalConfig, target, tokenizer, drafters: dict[str, DSparkDrafter]) -> dict:
    """Run (or resume) the whole evaluation; writes and returns the JSON report (see `eval_report`)."""
    from .eval_report import write_report

    report, arrays = evaluate(config, target, tokenizer, drafters)
    return write_report(report, config.out, arrays)


def evaluate(config: EvalConfig, target, tokenizer, drafters: dict[str, DSparkDrafter]) -> tuple[dict, dict]:
    """`run_eval` without writing anything but the work file: (report, reliability arrays for the figures)."""
    from .eval_report import build_report

    if PROMPT_LOOKUP in drafters:
        raise ValueError(f"the drafter name {PROMPT_LOOKUP!r} is reserved for --prompt-lookup")
    if not drafters and not config.prompt_lookup:
        raise ValueError("nothing to evaluate: give drafters and/or enable prompt lookup")
    torch.set_num_threads(config.threads)
    start = time.perf_counter()
    sets = load_sets(config)
    plans, skipped = make_plans(config, target, drafters)
    against = target_identity(target)  # a record is reused only for the same drafter and target
    identities = {name: f"{drafter_identity(drafter)}-{against}" for name, drafter in drafters.items()}
    identities[PROMPT_LOOKUP] = f"{PROMPT_LOOKUP}-{against}"  # rule-based: no weights of its own
    work = WorkFile(config.work_path, config.fingerprint, config.resume, identities)
    for plan in plans:
        if isinstance(plan.drafter, torch.nn.Module):  # model-free drafters (prompt lookup) have no eval mode
            plan.drafter.eval()
        for set_name, items in sets.items():
            run_plan_on_set(plan, set_name, items, target, tokenizer, config, work)
    arrays: dict = {}
    report = build_report(config, plans, skipped, sets, work, wall_seconds=time.perf_counter() - start, arrays=arrays)
    return {"config": asdict(config), **report}, arrays
