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
Refused up front: flash / flex-attention targets (built), and requests whose positions could cross a
length-dependent RoPE threshold (dynamic NTK, longrope), since the running rows share each forward.

`add_request` copies the prompt; `add_request`, `cancel`, `result` and `take_finished` are safe from other threads
during `step()`. A round that raises is undone: its requests go back to the queue with the tokens they had and are
prefilled again (twice in a row: they finish with `EngineRequest.error`). `take_finished()` releases finished
requests; `records` keeps the last `max_records` rounds.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..generation.call_checks import check_attention_implementation, rope_reach_refusal, rope_threshold
from ..generation.drafting import feature_layers
from ..generation.options import DSparkGenerationOptions, check_sampling_settings, eos_token_ids
from ..generation.policy import VerificationPolicy, policy_from_options
from ..generation.prefill import prefill_target
from ..generation.processors import RowProcessors
from ..generation.round import RoundBatch, RoundKernel, RoundRecord
from ..generation.state import bind_drafter
from ..ops.functional import greedy_token_ids
from ..scheduling.registry import NO_SPECULATION, available_policies, canonical_policy_name
from ..target.checks import check_target
from ..target.packed_linear import linear_packs_for
from .inputs import RequestHistories, check_engine_arguments, prompt_tensor, sampling_warpers

if TYPE_CHECKING:
    from ..generation.drafting import DraftModel


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
    cancelled: bool = False
    error: BaseException | None = None
    failures: int = 0

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


def _named_policy(
    name: str, target, drafter: DraftModel, do_sample: bool, packed_weights: bool | None = None
) -> VerificationPolicy:
    """The policy `generate` builds for `dspark_policy=name`: the curves of this target and drafter (cache, shipped,
    else profiled once) and, for "auto", the drafter's pooled acceptance for the decoding mode."""
    if canonical_policy_name(name) not in available_policies():
        raise ValueError(
            f"policy must be {NO_SPECULATION!r}, one of {list(available_policies())} or a "
            f"VerificationPolicy; got {name!r}."
        )
    options = DSparkGenerationOptions(dspark_policy=name, dspark_packed_weights=packed_weights)
    return policy_from_options(
        options, drafter.config.block_size, greedy=not do_sample, target=target, drafter=drafter
    )


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
        max_records: round records kept in `records` (the latest; None keeps all).
    """

    def __init__(
        self,
        target,
        drafter: DraftModel | None = None,
        policy: VerificationPolicy | str = "none",
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | list[int] | None = None,
        max_running: int = 64,
        packed_weights: bool | None = None,
        max_records: int | None = 10_000,
    ) -> None:
        check_engine_arguments(policy, drafter, max_running)
        if max_records is not None and (type(max_records) is not int or max_records < 0):
            raise ValueError(f"max_records must be None (keep every round) or an int >= 0, got {max_records!r}.")
        check_sampling_settings(do_sample, temperature, top_k, top_p)  # as generate checks them
        eos = eos_token_ids(eos_token_id if eos_token_id is not None else target.generation_config.eos_token_id)
        check_target(target)  # quantized, offloaded or dropout-active targets, with every policy
        check_attention_implementation(target)  # flash / flex kernels take no per-row 4D masks
        if policy != "none":
            bind_drafter(target, drafter)  # binds an unbound drafter; refuses one bound to another target
        if isinstance(policy, str) and policy != "none":
            policy = _named_policy(policy, target, drafter, do_sample, packed_weights)
        if isinstance(policy, VerificationPolicy) and policy.name == "auto" and policy.greedy == do_sample:
            mode = "greedy" if policy.greedy else "sampling"
            raise ValueError(
                f"the 'auto' policy was built for {mode} (greedy={policy.greedy}) but the engine has "
                f"do_sample={do_sample}; build it with greedy={not do_sample}."
            )
        self.target, self.policy = target, policy
        self.drafter = drafter if policy != "none" else None
        self.do_sample = do_sample
        self.processors = RowProcessors(sampling_warpers(do_sample, temperature, top_k, top_p), 1)
        self.eos = set(eos)
        self.max_running = max_running
        self.packs = linear_packs_for(target, packed_weights)
        self.kernel = RoundKernel(
            target,
            self.drafter,
            policy if self.drafter is not None else None,
            self.processors,
            do_sample,
            packs=self.packs,
        )
        self.taps = feature_layers(self.drafter) if self.drafter is not None else []
        self.requests: dict[int, EngineRequest] = {}
        self.waiting: list[int] = []
        self.batch: RoundBatch | None = None
        self.records: deque[EngineRoundRecord] = deque(maxlen=max_records)
        self._next_id = 0
        self._queue_lock = threading.RLock()  # requests, waiting, ids: short critical sections, any thread
        self._step_lock = threading.Lock()  # one step at a time
        self._admitting: set[int] = set()  # taken from the queue, not yet in the batch
        weight = target.get_input_embeddings().weight
        self._target_kind = (weight.dtype, weight.device)

    @property
    def running(self) -> list[int]:
        """Request ids in the running batch, in batch order."""
        batch = self.batch  # read once: another thread's step may replace it
        return list(batch.rows) if batch is not None else []

    # ------------------------------------------------------------------ public API
    def add_request(self, prompt_ids: torch.Tensor | list[int], max_new_tokens: int = 128) -> int:
        """Queue a request (token ids of the full prompt, chat template applied); returns its id."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(
                f"a request needs at least one prompt token and max_new_tokens >= 1 (an int), got "
                f"max_new_tokens={max_new_tokens!r}"
            )
        prompt = prompt_tensor(prompt_ids, int(self.target.get_input_embeddings().num_embeddings))
        self._check_rope_reach(prompt.numel(), max_new_tokens)
        with self._queue_lock:
            rid = self._next_id
            self._next_id += 1
            self.requests[rid] = EngineRequest(rid, prompt, max_new_tokens, arrival=time.perf_counter())
            self.waiting.append(rid)
        return rid

    def _check_rope_reach(self, prompt_length: int, max_new_tokens: int) -> None:
        """Refuse a request whose forwards could cross a length-dependent RoPE threshold: the running rows share
        each forward, so one row past it would change every row's frequencies (`call_checks.rope_reach_refusal`)."""
        found = rope_threshold(self.target.config.get_text_config(decoder=True))
        if found is None:
            return
        gamma = self.drafter.config.block_size if self.drafter is not None else 0
        slots = f", γ = {gamma} draft slots" if gamma else ""
        reason = rope_reach_refusal(
            self.target,
            prompt_length + max_new_tokens + gamma,
            f"This request ({prompt_length} prompt tokens, max_new_tokens={max_new_tokens}{slots})",
            f"Keep prompt + max_new_tokens at most {found[1] - gamma} tokens per request, or serve this target "
            "without DSparkEngine.",
        )
        if reason is not None:
            raise ValueError(reason)

    def has_work(self) -> bool:
        with self._queue_lock:
            return bool(self.waiting or self.running)

    def result(self, request_id: int) -> EngineRequest:
        """The request's state: `generated` tokens so far, `finished`, `error`, timings."""
        with self._queue_lock:
            if request_id not in self.requests:
                raise KeyError(
                    f"unknown request id {request_id!r}: add_request returns the ids this engine knows "
                    "(take_finished forgets the requests it returns)"
                )
            return self.requests[request_id]

    def cancel(self, request_id: int) -> None:
        """Finish a request now (waiting or running); its tokens so far stay in `result`. Safe during `step()` in
        another thread: a running request leaves the batch when the round ends."""
        with self._queue_lock:
            request = self.result(request_id)
            if not request.finished:
                request.finished, request.finished_at = True, time.perf_counter()
            request.cancelled = True
            if request_id in self.waiting:
                self.waiting.remove(request_id)
        if self._step_lock.acquire(blocking=False):  # no round runs: leave the batch now
            try:
                self._drop_finished()
            finally:
                self._step_lock.release()

    def take_finished(self) -> list[EngineRequest]:
        """The finished requests (done, cancelled or failed), in id order, forgotten by the engine: a serving loop
        calls this to release them (`result` then no longer knows their ids)."""
        with self._queue_lock:
            running = set(self.running) | self._admitting
            done = [r for rid, r in sorted(self.requests.items()) if r.finished and rid not in running]
            for request in done:
                del self.requests[request.request_id]
            return done

    @torch.no_grad()
    def step(self) -> list[tuple[int, list[int]]]:
        """Admit waiting requests, run one round; returns (request_id, new tokens) for every request that gained.

        If the round raises, its commits are undone, its requests go back to the front of the queue (prefilled
        again at the next step) and the exception propagates; the engine stays usable."""
        with self._step_lock:
            self._check_target_unchanged()
            if self.packs is not None:
                self.packs.refresh(self.target)  # weights changed since the last step: repack them
            start = time.perf_counter()
            events = self._admit()
            self._drop_finished()  # a request can finish on its first token (EOS, max_new_tokens = 1)
            if self.batch is not None:
                events += self._guarded_round(start)
            self._drop_finished()
            return events

    def _check_target_unchanged(self) -> None:
        weight = self.target.get_input_embeddings().weight
        if (weight.dtype, weight.device) != self._target_kind:
            dtype, device = self._target_kind
            raise RuntimeError(
                f"the target moved from {dtype} on {device} to {weight.dtype} on {weight.device} "
                "after this DSparkEngine was built; its caches and drafter are in the old dtype and "
                "device: build a new DSparkEngine for the moved target (and re-bind the drafter)."
            )

    def _guarded_round(self, start: float) -> list[tuple[int, list[int]]]:
        """`_round`, undone on an exception (`_requeue`)."""
        batch = self.batch
        before = {rid: len(self.requests[rid].generated) for rid in batch.rows}
        try:
            events = self._round(start)
        except Exception as error:
            self._requeue(batch, before, error)
            raise
        for rid in batch.rows:
            self.requests[rid].failures = 0
        return events

    def _requeue(self, batch: RoundBatch, before: dict[int, int], error: Exception) -> None:
        """Every request of a failed round gets back the tokens it had before it and returns to the front of the
        queue (the batch and its caches are dropped); one whose round failed twice in a row finishes with the error."""
        requeued = []
        with self._queue_lock:  # take_finished must not see the batch gone before its requests are rolled back
            self.batch = None
            if isinstance(self.policy, VerificationPolicy):
                self.policy.forget(list(batch.rows))
            for rid, length in before.items():
                request = self.requests[rid]
                del request.generated[length:]
                request.failures += 1
                if request.cancelled:
                    continue
                if request.failures >= 2:
                    request.finished, request.finished_at, request.error = True, time.perf_counter(), error
                    continue
                request.finished, request.finished_at = False, None
                requeued.append(rid)
            self.waiting = requeued + self.waiting

    # ------------------------------------------------------------------ admission (prefill)
    def _admit(self) -> list[tuple[int, list[int]]]:
        room = self.max_running - len(self.running)
        with self._queue_lock:
            new, self.waiting = self.waiting[:room], self.waiting[room:]
            self._admitting = set(new)
        if not new:
            return []
        try:
            return self._prefill(new)
        finally:
            self._admitting = set()

    def _prefill(self, new: list[int]) -> list[tuple[int, list[int]]]:
        prompts = [self.requests[r].history for r in new]  # a request sent back by a failed round: what it kept
        width = max(p.numel() for p in prompts)
        ids = torch.zeros(len(new), width, dtype=torch.long)
        mask = torch.zeros(len(new), width, dtype=torch.long)
        for i, prompt in enumerate(prompts):
            ids[i, width - prompt.numel() :], mask[i, width - prompt.numel() :] = prompt, 1
        device = self.target.device
        ids, mask = ids.to(device), mask.to(device)
        try:
            out = prefill_target(self.target, ids, mask, None, None, self.taps)  # sliding windows become masks
            first = self._pick(self.processors.apply([], [], out.logits))
            batch = self.kernel.start(new, first, out.target, out.features, out.valid)
        except Exception:
            with self._queue_lock:
                self.waiting = [r for r in new if not self.requests[r].finished] + self.waiting  # wait again
            raise
        if self.batch is None:
            self.batch = batch
        else:
            self.batch.extend(batch)
        now = time.perf_counter()
        events = []
        for rid, token in zip(new, first.tolist()):
            if self.requests[rid].admitted is None:
                self.requests[rid].admitted = now
            events.append((rid, self._commit(rid, [token])))
        return events

    # ------------------------------------------------------------------ one round
    def _pick(self, scores: torch.Tensor) -> torch.Tensor:
        if not self.do_sample:
            return greedy_token_ids(scores)
        return torch.multinomial(torch.softmax(scores, dim=-1), 1).squeeze(-1)

    def _round(self, start: float) -> list[tuple[int, list[int]]]:
        batch = self.batch
        requests = [self.requests[r] for r in batch.rows]
        left = [r.max_new_tokens - len(r.generated) for r in requests]  # host ints
        histories = RequestHistories(requests)  # built only where a drafter reads them
        events: list[tuple[int, list[int]]] = []

        def commit(tokens: list[list[int]], scores: torch.Tensor, logits: torch.Tensor) -> list[int]:
            counts = []
            for rid, row_tokens in zip(batch.rows, tokens):
                kept = self._commit(rid, row_tokens)
                events.append((rid, kept))
                counts.append(len(kept))
            return counts

        record: RoundRecord = self.kernel.step(batch, histories, [n - 1 for n in left], commit)
        self.records.append(
            EngineRoundRecord(
                len(record.rows),
                record.verify_len,
                record.committed,
                time.perf_counter() - start,
                record.drafted,
                record.policy_seconds,
            )
        )
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
