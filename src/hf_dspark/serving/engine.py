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
    engine.result(rid)  # finished: returned once, then released

Supported per request: greedy or sampling with temperature/top-k/top-p (shared by the engine), EOS and
`max_new_tokens`. Stop strings and history-dependent processors belong to `generate`.
Refused up front: flash / flex-attention targets (built), and requests whose positions could cross a
length-dependent RoPE threshold (dynamic NTK, longrope), since the running rows share each forward.

Faults: a prefill or a round that raises (out of memory on one huge prompt, a bad row) does not propagate. A round
that raises is undone (its requests get back the tokens they had). The requests of the failed forward are then
retried once, each alone (prefill, plus the round for a failed round): a request that fails alone finishes with
`EngineRequest.error` / `error_message`, the others rejoin the batch and go on as if nothing happened (greedy
tokens stay equal to plain `generate`).

Memory: a finished request is released once `result()` or `take_finished()` returns it; the engine keeps at most
`max_finished` uncollected finished requests (the oldest are dropped) and the last `max_records` round records.
`add_request`, `cancel`, `result` and `take_finished` are safe from other threads during `step()`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch

from ..generation.call_checks import check_call, eos_token_ids
from ..generation.drafting import feature_layers
from ..generation.prefill import prefill_target
from ..generation.processors import RowProcessors
from ..generation.round import RoundBatch
from ..generation.tree_round import round_kernel
from ..ops.functional import greedy_token_ids
from ..scheduling.records import RoundRecord
from ..scheduling.verification_policy import VerificationPolicy
from ..target.packed_linear import linear_packs_for
from .faults import EngineFaults, Events
from .inputs import (
    RequestHistories,
    check_engine_arguments,
    check_rope_reach,
    named_policy,
    prompt_tensor,
    sampling_warpers,
)
from .requests import DEFAULT_MAX_FINISHED, EngineRequest, EngineRoundRecord, FinishedRequests

if TYPE_CHECKING:
    from ..proposers.base import DraftModel


class DSparkEngine(EngineFaults):
    """Continuous-batching DSpark serving loop (public API: add_request, step, has_work, result, cancel,
    take_finished).

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
        max_finished: finished requests kept until `result` or `take_finished` collects them (1024 by default);
            beyond it the oldest are dropped, with a warning. None keeps every uncollected one (unbounded memory).
        tree_budget: as `generate`'s `dspark_tree_budget`: each drafting request verifies a draft tree of at most
            this many nodes a round (`generation.tree_round`; `"auto"` sizes the trees by cost up to it), or None
            for chains. Drafters or attention kernels that cannot verify trees fall back to chains, said once.
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
        max_finished: int | None = DEFAULT_MAX_FINISHED,
        tree_budget: int | None = None,
    ) -> None:
        check_engine_arguments(policy, drafter, max_running)
        if max_records is not None and (type(max_records) is not int or max_records < 0):
            raise ValueError(f"max_records must be None (keep every round) or an int >= 0, got {max_records!r}.")
        self.finished = FinishedRequests(max_finished)  # checks max_finished
        eos_ids = eos_token_id if eos_token_id is not None else target.generation_config.eos_token_id
        decoding = SimpleNamespace(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
                                   eos_token_id=eos_ids)
        # generate's checks, once (target, sampling and EOS settings; binds an unbound drafter, refuses one bound
        # to another target)
        check_call(target, drafter if policy != "none" else None, decoding)
        eos = eos_token_ids(eos_ids)
        if isinstance(policy, str) and policy != "none":
            policy = named_policy(policy, target, drafter, do_sample, packed_weights)
        if isinstance(policy, VerificationPolicy) and policy.rule.per_decoding_mode and policy.greedy == do_sample:
            mode = "greedy" if policy.greedy else "sampling"
            raise ValueError(
                f"the {policy.name!r} policy was built for {mode} (greedy={policy.greedy}) but the engine has "
                f"do_sample={do_sample}; build it with greedy={not do_sample}."
            )
        self.target, self.policy = target, policy
        self.drafter = drafter if policy != "none" else None
        self.do_sample = do_sample
        self.processors = RowProcessors(sampling_warpers(do_sample, temperature, top_k, top_p), 1)
        self.eos = set(eos)
        self.max_running = max_running
        self.packs = linear_packs_for(target, packed_weights)
        if tree_budget is not None and (type(tree_budget) is not int or tree_budget < 2):
            raise ValueError(f"tree_budget must be None (chains) or an int >= 2 (nodes per row and round, the anchor "
                             f"included), got {tree_budget!r}.")
        # `TreeRoundKernel` with a tree budget (or chains, said once, where trees cannot run), else `RoundKernel`
        self.kernel = round_kernel(
            tree_budget,
            target,
            self.drafter,
            policy if self.drafter is not None else None,
            self.processors,
            do_sample,
            packs=self.packs,
        )
        self.taps = feature_layers(self.drafter) if self.drafter is not None else []
        self.requests: dict[int, EngineRequest] = {}  # waiting, being admitted or running (finished: `finished`)
        self.waiting: list[int] = []
        self.batch: RoundBatch | None = None
        self.records: deque[EngineRoundRecord] = deque(maxlen=max_records)
        self._next_id = 0
        self._queue_lock = threading.RLock()  # requests, finished, waiting, ids: short critical sections
        self._step_lock = threading.Lock()  # one step at a time
        self._admitting: set[int] = set()  # taken from the queue, not yet in the batch
        self._released: set[int] = set()  # finished, returned by `result`, still in the batch: not kept
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
        gamma = self.drafter.config.block_size if self.drafter is not None else 0
        check_rope_reach(self.target, gamma, prompt.numel(), max_new_tokens)
        with self._queue_lock:
            rid = self._next_id
            self._next_id += 1
            self.requests[rid] = EngineRequest(rid, prompt, max_new_tokens, arrival=time.perf_counter())
            self.waiting.append(rid)
        return rid

    def has_work(self) -> bool:
        with self._queue_lock:
            return bool(self.waiting or self.running)

    def result(self, request_id: int) -> EngineRequest:
        """The request's state: `generated` tokens so far, `finished`, `cancelled`, `error`, timings. A finished
        request is returned once and then released (a later call raises `KeyError`)."""
        with self._queue_lock:
            request = self._lookup(request_id)
            if request.finished and self.finished.pop(request_id) is None:
                self._released.add(request_id)  # still leaving the batch: not kept when it does
            return request

    def _lookup(self, request_id: int) -> EngineRequest:
        request = self.requests.get(request_id) or self.finished.get(request_id)
        if request is None:
            raise KeyError(
                f"unknown request id {request_id!r}: add_request returns the ids this engine knows. A finished "
                "request is released once result() or take_finished() has returned it, and at most "
                f"max_finished={self.finished.limit} uncollected finished requests are kept (the oldest go first)."
            )
        return request

    def cancel(self, request_id: int) -> None:
        """Finish a request now (waiting or running); its tokens so far stay in `result`. Safe during `step()` in
        another thread: a running request leaves the batch when the round ends. A finished request stays as it is."""
        with self._queue_lock:
            request = self._lookup(request_id)
            if request.finished:
                return
            request.finished, request.finished_at, request.cancelled = True, time.perf_counter(), True
            if request_id in self.waiting:
                self.waiting.remove(request_id)
                self._retire([request_id])
        if self._step_lock.acquire(blocking=False):  # no round runs: leave the batch now
            try:
                self._drop_finished()
            finally:
                self._step_lock.release()

    def take_finished(self) -> list[EngineRequest]:
        """The finished requests (done, cancelled or failed) that left the batch, in id order, released by the
        engine: a serving loop calls this to collect them (`result` then no longer knows their ids)."""
        with self._queue_lock:
            return self.finished.take_all()

    @torch.no_grad()
    def step(self) -> Events:
        """Admit waiting requests, run one round; returns (request_id, new tokens) for every request that gained.

        A prefill or round that raises is undone and its requests retried once, each alone; one that fails alone
        finishes with `error` (see the module docstring). The exception does not propagate."""
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

    # ------------------------------------------------------------------ admission (prefill)
    def _admit(self) -> Events:
        room = self.max_running - len(self.running)
        with self._queue_lock:
            new, self.waiting = self.waiting[:room], self.waiting[room:]
            self._admitting = set(new)
        if not new:
            return []
        try:
            try:
                batch, tokens = self._prefill(new)
            except Exception as error:
                self._log_fault("prefill", new, error)
                return self._retry_alone(new, "prefill")
            events = self._commit_first(batch, tokens)
            self._join(batch)
            return events
        finally:
            self._admitting = set()

    def _prefill(self, new: list[int]) -> tuple[RoundBatch, list[int]]:
        """One prefill forward for `new` (left-padded): their batch and first tokens (host ints)."""
        prompts = [self.requests[r].history for r in new]  # a request back from a failed round: what it kept
        width = max(p.numel() for p in prompts)
        ids = torch.zeros(len(new), width, dtype=torch.long)
        mask = torch.zeros(len(new), width, dtype=torch.long)
        for i, prompt in enumerate(prompts):
            ids[i, width - prompt.numel() :], mask[i, width - prompt.numel() :] = prompt, 1
        device = self.target.device
        ids, mask = ids.to(device), mask.to(device)
        out = prefill_target(self.target, ids, mask, None, None, self.taps)  # sliding windows become masks
        first = self._pick(self.processors.apply([], [], out.logits))
        batch = self.kernel.start(new, first, out.target, out.features, out.valid)
        return batch, first.tolist()

    def _commit_first(self, batch: RoundBatch, tokens: list[int]) -> Events:
        now = time.perf_counter()
        events = []
        for rid, token in zip(batch.rows, tokens):
            request = self.requests[rid]
            if request.admitted is None:
                request.admitted = now
            events.append((rid, self._commit(rid, [token])))
        return events

    def _join(self, batch: RoundBatch) -> None:
        if self.batch is None:
            self.batch = batch
        else:
            self.batch.extend(batch)

    # ------------------------------------------------------------------ one round
    def _pick(self, scores: torch.Tensor) -> torch.Tensor:
        if not self.do_sample:
            return greedy_token_ids(scores)
        return torch.multinomial(torch.softmax(scores, dim=-1), 1).squeeze(-1)

    def _round(self, batch: RoundBatch, start: float) -> Events:
        requests = [self.requests[r] for r in batch.rows]
        left = [r.max_new_tokens - len(r.generated) for r in requests]  # host ints
        histories = RequestHistories(requests)  # built only where a drafter reads them
        events: Events = []

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
                record.nodes_verified,
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
        gone = [rid for rid in self.batch.rows if self.requests[rid].finished]
        if not gone:
            return
        if isinstance(self.policy, VerificationPolicy):
            self.policy.forget(gone)
        keep = [a for a, rid in enumerate(self.batch.rows) if not self.requests[rid].finished]
        if not keep:
            self.batch = None
        else:
            self.batch.keep(keep)
        self._retire(gone)


__all__ = ["DSparkEngine", "EngineRequest", "EngineRoundRecord"]
