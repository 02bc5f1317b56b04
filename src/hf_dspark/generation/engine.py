"""`DSparkEngine`: continuous batching on the DSpark loop's parts, for serving-load benchmarks and streaming.

Requests join and leave the running batch between rounds. Each `step()` admits waiting requests (one prefill
forward for all of them, merged into the running batch's ragged KV cache), then runs one DSpark round for every
running request with the round kernel `generate` uses (`round.RoundKernel`: plan → propose → choose ℓ_r → one
target forward → verify → commit → extend the drafter's context), with a `VerificationPolicy` or `"none"` for
plain batched decoding, and returns the tokens each request gained.

    engine = DSparkEngine(target, drafter, policy=VerificationPolicy("lagged", block_size=7, step_curve=curve))
    rid = engine.add_request(prompt_ids, max_new_tokens=128)
    while engine.has_work():
        for request_id, tokens in engine.step(): ...
    engine.result(rid)

Supported per request: greedy or sampling with temperature/top-k/top-p (shared by the engine), EOS and
`max_new_tokens`. Stop strings and history-dependent processors belong to `generate`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from .drafting import feature_layers
from .options import check_sampling_settings, eos_token_ids
from .packed_linear import linear_packs_for
from .policy import POLICIES, VerificationPolicy, policy_from_config
from .prefill import prefill_target
from .processors import RowProcessors
from .round import RoundBatch, RoundKernel, RoundRecord
from .state import bind_drafter

if TYPE_CHECKING:
    from .drafting import DraftModel


@dataclass
class EngineRequest:
    """One request's state and timings (seconds from `time.perf_counter`)."""

    request_id: int
    prompt_ids: torch.Tensor
    max_new_tokens: int
    generated: list[int] = field(default_factory=list)
    finished: bool = False
    arrival: float = 0.0
    admitted: float | None = None
    finished_at: float | None = None
    rounds: int = 0

    @property
    def history(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.prompt_ids.new_tensor(self.generated)])


@dataclass
class EngineRoundRecord:
    """running: rows in the round; verify_lens / committed: per row; drafted: rows that ran the drafter;
    seconds: the whole `step` (admission included); policy_seconds: the policy's decisions."""

    running: int
    verify_lens: list[int]
    committed: list[int]
    seconds: float
    drafted: int = 0
    policy_seconds: float = 0.0


def _warpers(do_sample: bool, temperature: float, top_k: int | None, top_p: float | None) -> LogitsProcessorList:
    warpers = LogitsProcessorList()
    if do_sample:
        if temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(temperature))
        if top_k:
            warpers.append(TopKLogitsWarper(top_k))
        if top_p is not None and top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p))
    return warpers


def _check_engine_arguments(policy, drafter, max_running) -> None:
    """Refuse a bad policy / drafter pairing or batch size before anything runs."""
    if not isinstance(policy, (str, VerificationPolicy)):
        raise ValueError(f"policy must be 'none', a policy name or a VerificationPolicy; got {type(policy).__name__}.")
    if policy != "none" and drafter is None:
        raise ValueError(f"policy {policy!r} needs a drafter; use policy='none' for plain decoding")
    gamma = getattr(getattr(drafter, "config", None), "block_size", None)
    if isinstance(policy, VerificationPolicy) and gamma is not None and policy.block_size != gamma:
        raise ValueError(f"the policy was built for block_size={policy.block_size} but the drafter drafts γ = {gamma} "
                         f"tokens; build it with block_size={gamma}.")
    if isinstance(max_running, bool) or not isinstance(max_running, int) or max_running < 1:
        raise ValueError(f"max_running must be an int >= 1 (requests in the running batch), got {max_running!r}.")


def _prompt_tensor(prompt_ids, vocab_size: int) -> torch.Tensor:
    """One prompt as a 1-D long tensor: a list of ints, a 1-D integer tensor or a `[1, L]` one; ids in 0..V-1."""
    if isinstance(prompt_ids, (str, bytes)):
        raise ValueError("add_request takes token ids (a list of ints or an integer tensor), not text: tokenize the "
                         "prompt first (chat template applied).")
    prompt = torch.as_tensor(prompt_ids)
    if prompt.numel() == 0:
        raise ValueError("a request needs at least one prompt token and max_new_tokens >= 1")
    if prompt.dtype.is_floating_point or prompt.dtype.is_complex or prompt.dtype == torch.bool:
        raise ValueError(f"prompt ids must be integers, got dtype {prompt.dtype}.")
    if prompt.dim() == 2 and prompt.shape[0] == 1:
        prompt = prompt[0]
    if prompt.dim() != 1:
        raise ValueError(f"add_request takes one prompt (a 1-D sequence or [1, L]), got shape {tuple(prompt.shape)}; "
                         "call add_request once per row of a batch.")
    if int(prompt.min()) < 0 or int(prompt.max()) >= vocab_size:
        bad = prompt[(prompt < 0) | (prompt >= vocab_size)].tolist()
        raise ValueError(f"prompt token ids {bad[:5]} are outside the target's vocabulary 0..{vocab_size - 1}.")
    return prompt.long().cpu()


def _named_policy(name: str, target, drafter: DraftModel, do_sample: bool,
                  packed_weights: bool | None = None) -> VerificationPolicy:
    """The policy `generate` builds for `dspark_policy=name`: the curves of this target and drafter (cache, shipped,
    else profiled once) and, for "auto", the drafter's pooled acceptance for the decoding mode."""
    if name not in POLICIES:
        raise ValueError(f"policy must be 'none', one of {list(POLICIES)} or a VerificationPolicy; got {name!r}.")
    settings = SimpleNamespace(dspark_policy=name, do_sample=do_sample, dspark_packed_weights=packed_weights)
    return policy_from_config(settings, drafter.config.block_size, target=target, drafter=drafter)


class DSparkEngine:
    """Continuous-batching DSpark serving loop (public API: add_request, step, has_work, result, cancel).

    Args:
        target: the target causal LM (its KV cache layers must be full-attention dynamic layers).
        drafter: a drafter (`DSparkDrafter`, bound to `target` here if unbound, or any `DraftModel`), or None for
            plain batched decoding. A drafter bound to another target instance is refused (`ValueError`): binding
            it here would take it from that target and its engines; bind it explicitly or load a second one.
        policy: a policy name as `generate`'s `dspark_policy` takes it (e.g. `"auto"`, which decodes plainly when
            drafting does not pay; built as `generate` builds it: this target's and drafter's cost curves, the
            drafter's pooled acceptance for the decoding mode), a `VerificationPolicy`, or `"none"` (ℓ = 0, no
            drafting: the no-speculation baseline).
        do_sample, temperature, top_k, top_p: decoding settings shared by all requests.
        eos_token_id: token id(s) that end a request (default: the target's generation config).
        max_running: at most this many requests in the running batch; the rest wait.
        packed_weights: as `generate`'s `dspark_packed_weights`, for every policy (plain decoding included, so
            policies compare on the same kernels): True / False, or None to pack float32 CPU targets when the
            copies fit in memory (`packed_linear.linear_packs_for`).
    """

    def __init__(self, target, drafter: DraftModel | None = None, policy: VerificationPolicy | str = "none",
                 do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, eos_token_id: int | list[int] | None = None,
                 max_running: int = 64, packed_weights: bool | None = None) -> None:
        _check_engine_arguments(policy, drafter, max_running)
        check_sampling_settings(do_sample, temperature, top_k, top_p)  # as generate checks them
        eos = eos_token_ids(eos_token_id if eos_token_id is not None else target.generation_config.eos_token_id)
        if policy != "none":
            bind_drafter(target, drafter)  # binds an unbound drafter; refuses one bound to another target
        if isinstance(policy, str) and policy != "none":
            policy = _named_policy(policy, target, drafter, do_sample, packed_weights)
        if isinstance(policy, VerificationPolicy) and policy.name == "auto" and policy.greedy == do_sample:
            mode = "greedy" if policy.greedy else "sampling"
            raise ValueError(f"the 'auto' policy was built for {mode} (greedy={policy.greedy}) but the engine has "
                             f"do_sample={do_sample}; build it with greedy={not do_sample}.")
        self.target, self.policy = target, policy
        self.drafter = drafter if policy != "none" else None
        self.do_sample = do_sample
        self.processors = RowProcessors(_warpers(do_sample, temperature, top_k, top_p), 1)
        self.eos = set(eos)
        self.max_running = max_running
        self.kernel = RoundKernel(target, self.drafter, policy if self.drafter is not None else None,
                                  self.processors, do_sample, packs=linear_packs_for(target, packed_weights))
        self.taps = feature_layers(self.drafter) if self.drafter is not None else []
        self.requests: dict[int, EngineRequest] = {}
        self.waiting: list[int] = []
        self.batch: RoundBatch | None = None
        self.records: list[EngineRoundRecord] = []
        self._next_id = 0

    @property
    def running(self) -> list[int]:
        """Request ids in the running batch, in batch order."""
        return list(self.batch.rows) if self.batch is not None else []

    # ------------------------------------------------------------------ public API
    def add_request(self, prompt_ids: torch.Tensor | list[int], max_new_tokens: int = 128) -> int:
        """Queue a request (token ids of the full prompt, chat template applied); returns its id."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"a request needs at least one prompt token and max_new_tokens >= 1 (an int), got "
                             f"max_new_tokens={max_new_tokens!r}")
        prompt = _prompt_tensor(prompt_ids, int(self.target.get_input_embeddings().num_embeddings))
        rid = self._next_id
        self._next_id += 1
        self.requests[rid] = EngineRequest(rid, prompt, max_new_tokens, arrival=time.perf_counter())
        self.waiting.append(rid)
        return rid

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def result(self, request_id: int) -> EngineRequest:
        """The request's state: `generated` tokens so far, `finished`, timings."""
        if request_id not in self.requests:
            raise KeyError(f"unknown request id {request_id!r}: add_request returns the ids this engine knows")
        return self.requests[request_id]

    def cancel(self, request_id: int) -> None:
        """Finish a request now (waiting or running); its tokens so far stay in `result`."""
        request = self.result(request_id)
        request.finished, request.finished_at = True, time.perf_counter()
        if request_id in self.waiting:
            self.waiting.remove(request_id)
        self._drop_finished()

    @torch.no_grad()
    def step(self) -> list[tuple[int, list[int]]]:
        """Admit waiting requests, run one round; returns (request_id, new tokens) for every request that gained."""
        start = time.perf_counter()
        events = self._admit()
        self._drop_finished()  # a request can finish on its first token (EOS, max_new_tokens = 1)
        if self.batch is not None:
            events += self._round(start)
        self._drop_finished()
        return events

    # ------------------------------------------------------------------ admission (prefill)
    def _admit(self) -> list[tuple[int, list[int]]]:
        room = self.max_running - len(self.running)
        new, self.waiting = self.waiting[:room], self.waiting[room:]
        if not new:
            return []
        prompts = [self.requests[r].prompt_ids for r in new]
        width = max(p.numel() for p in prompts)
        ids = torch.zeros(len(new), width, dtype=torch.long)
        mask = torch.zeros(len(new), width, dtype=torch.long)
        for i, prompt in enumerate(prompts):
            ids[i, width - prompt.numel() :], mask[i, width - prompt.numel() :] = prompt, 1
        device = self.target.device
        ids, mask = ids.to(device), mask.to(device)
        try:
            out = prefill_target(self.target, ids, mask, None, None, self.taps)  # sliding windows become masks
        except Exception:
            self.waiting = new + self.waiting  # nothing was admitted: the requests wait again
            raise
        first = self._pick(self.processors.apply([], [], out.logits))
        batch = self.kernel.start(new, first, out.target, out.features, out.valid)
        if self.batch is None:
            self.batch = batch
        else:
            self.batch.extend(batch)
        now = time.perf_counter()
        events = []
        for rid, token in zip(new, first.tolist()):
            self.requests[rid].admitted = now
            events.append((rid, self._commit(rid, [token])))
        return events

    # ------------------------------------------------------------------ one round
    def _pick(self, scores: torch.Tensor) -> torch.Tensor:
        if not self.do_sample:
            return scores.argmax(dim=-1)
        return torch.multinomial(torch.softmax(scores, dim=-1), 1).squeeze(-1)

    def _round(self, start: float) -> list[tuple[int, list[int]]]:
        batch = self.batch
        requests = [self.requests[r] for r in batch.rows]
        left = torch.tensor([r.max_new_tokens - len(r.generated) for r in requests], device=batch.anchor.device)
        histories = [r.history for r in requests]
        events: list[tuple[int, list[int]]] = []

        def commit(a: int, tokens: list[int], scores: torch.Tensor, logits: torch.Tensor) -> int:
            kept = self._commit(batch.rows[a], tokens)
            events.append((batch.rows[a], kept))
            return len(kept)

        record: RoundRecord = self.kernel.step(batch, histories, left - 1, commit)
        self.records.append(EngineRoundRecord(len(record.rows), record.verify_len, record.committed,
                                              time.perf_counter() - start, record.drafted, record.policy_seconds))
        return events

    def _commit(self, rid: int, tokens: list[int]) -> list[int]:
        request = self.requests[rid]
        if request.finished:
            return []
        request.rounds += 1
        kept = []
        for token in tokens:
            request.generated.append(token)
            kept.append(token)
            if token in self.eos or len(request.generated) >= request.max_new_tokens:
                request.finished, request.finished_at = True, time.perf_counter()
                break
        return kept

    def _drop_finished(self) -> None:
        if self.batch is None:
            return
        keep = [a for a, rid in enumerate(self.batch.rows) if not self.requests[rid].finished]
        if len(keep) == len(self.batch.rows):
            return
        gone = [rid for rid in self.batch.rows if self.requests[rid].finished]
        if isinstance(self.policy, VerificationPolicy):
            self.policy.forget(gone)
        if not keep:
            self.batch = None
            return
        self.batch.keep(keep)
