"""`DSparkEngine`: continuous batching on the DSpark loop's parts, for serving-load benchmarks and streaming.

Requests join and leave the running batch between rounds. Each `step()` admits waiting requests (one prefill
forward for all of them, merged into the running batch's ragged KV cache), then runs one DSpark round for every
running request: propose → choose ℓ_r (a `VerificationPolicy`, or `"none"` for plain batched decoding) → one
target forward → verify → commit, and returns the tokens each request gained.

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

import torch
from transformers.cache_utils import DynamicCache
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from ..cache import DSparkDraftCache
from ..modeling_dspark import DSparkDrafter
from ..verification import verify_greedy, verify_sampling
from .policy import VerificationPolicy
from .target_cache import RaggedTargetCache


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
    running: int
    verify_lens: list[int]
    committed: list[int]
    seconds: float


class DSparkEngine:
    """Continuous-batching DSpark serving loop (public API: add_request, step, has_work, result, cancel).

    Args:
        target: the target causal LM (its KV cache layers must be full-attention dynamic layers).
        drafter: a `DSparkDrafter` (bound to `target` here), or None for plain batched decoding.
        policy: a `VerificationPolicy`, or `"none"` (ℓ = 0, no drafting: the no-speculation baseline).
        do_sample, temperature, top_k, top_p: decoding settings shared by all requests.
        eos_token_id: token id(s) that end a request (default: the target's generation config).
        max_running: at most this many requests in the running batch; the rest wait.
    """

    def __init__(self, target, drafter: DSparkDrafter | None = None, policy: VerificationPolicy | str = "none",
                 do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, eos_token_id: int | list[int] | None = None,
                 max_running: int = 64) -> None:
        if policy != "none" and drafter is None:
            raise ValueError(f"policy {policy!r} needs a drafter; use policy='none' for plain decoding")
        self.target, self.drafter, self.policy = target, drafter, policy
        if drafter is not None and not drafter.bound_to(target):
            drafter.bind_target(target)
        self.do_sample = do_sample
        self.warpers = LogitsProcessorList()
        if do_sample:
            if temperature != 1.0:
                self.warpers.append(TemperatureLogitsWarper(temperature))
            if top_k:
                self.warpers.append(TopKLogitsWarper(top_k))
            if top_p is not None and top_p < 1.0:
                self.warpers.append(TopPLogitsWarper(top_p))
        eos = eos_token_id if eos_token_id is not None else target.generation_config.eos_token_id
        self.eos = set([eos] if isinstance(eos, int) else (eos or []))
        self.max_running = max_running
        self.taps = [i + 1 for i in drafter.config.target_layer_ids] if drafter is not None else []
        self.requests: dict[int, EngineRequest] = {}
        self.waiting: list[int] = []
        self.running: list[int] = []
        self.anchor: torch.Tensor | None = None
        self.target_cache: RaggedTargetCache | None = None
        self.draft_cache: DSparkDraftCache | None = None
        self.records: list[EngineRoundRecord] = []
        self._next_id = 0

    # ------------------------------------------------------------------ public API
    def add_request(self, prompt_ids: torch.Tensor | list[int], max_new_tokens: int = 128) -> int:
        """Queue a request (token ids of the full prompt, chat template applied); returns its id."""
        prompt = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(-1)
        if prompt.numel() == 0 or max_new_tokens < 1:
            raise ValueError("a request needs at least one prompt token and max_new_tokens >= 1")
        rid = self._next_id
        self._next_id += 1
        self.requests[rid] = EngineRequest(rid, prompt, max_new_tokens, arrival=time.perf_counter())
        self.waiting.append(rid)
        return rid

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def result(self, request_id: int) -> EngineRequest:
        return self.requests[request_id]

    def cancel(self, request_id: int) -> None:
        """Finish a request now (waiting or running); its tokens so far stay in `result`."""
        request = self.requests[request_id]
        request.finished, request.finished_at = True, time.perf_counter()
        if request_id in self.waiting:
            self.waiting.remove(request_id)
        self._drop_finished()

    @torch.no_grad()
    def step(self) -> list[tuple[int, list[int]]]:
        """Admit waiting requests, run one round; returns (request_id, new tokens) for every request that gained."""
        events = self._admit()
        if self.running:
            start = time.perf_counter()
            events += self._round()
            self.records[-1].seconds = time.perf_counter() - start
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
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        out = self.target(input_ids=ids, attention_mask=mask, position_ids=positions,
                          cache=DynamicCache(config=self.target.config), use_cache=True,
                          output_hidden_states=self.taps or None, logits_to_keep=1)
        first = self._pick(out.logits[:, -1].float())
        cache = RaggedTargetCache(out.cache, mask.bool(), mask.sum(dim=1))
        draft_cache = None
        if self.drafter is not None:
            draft_cache = self.drafter.init_cache(len(new))
            features = torch.cat([out.hidden_states[i] for i in self.taps], dim=-1)
            self.drafter.extend_context(draft_cache, features, mask.bool())
        self._merge(new, first, cache, draft_cache)
        now = time.perf_counter()
        events = []
        for rid, token in zip(new, first.tolist()):
            self.requests[rid].admitted = now
            events.append((rid, self._commit(rid, [token])))
        return events

    def _merge(self, new: list[int], first: torch.Tensor, cache: RaggedTargetCache, draft_cache) -> None:
        if not self.running:
            self.running, self.anchor, self.target_cache, self.draft_cache = list(new), first, cache, draft_cache
            return
        self.target_cache.add_rows(cache)
        if draft_cache is not None:
            self.draft_cache = DSparkDraftCache.concat([self.draft_cache, draft_cache])
        self.running += new
        self.anchor = torch.cat([self.anchor, first])

    # ------------------------------------------------------------------ one round
    def _pick(self, scores: torch.Tensor) -> torch.Tensor:
        if not self.do_sample:
            return scores.argmax(dim=-1)
        return torch.multinomial(torch.softmax(self.warpers(None, scores), dim=-1), 1).squeeze(-1)

    def _remaining(self) -> torch.Tensor:
        left = [self.requests[r].max_new_tokens - len(self.requests[r].generated) for r in self.running]
        return torch.tensor(left, device=self.anchor.device)

    def _round(self) -> list[tuple[int, list[int]]]:
        rows = len(self.running)
        proposal = None
        if self.policy == "none":
            verify_len = torch.zeros(rows, dtype=torch.long, device=self.anchor.device)
        else:
            warp = (lambda k, drafts, logits: self.warpers(None, logits)) if len(self.warpers) else None
            proposal = self.drafter.propose(self.anchor, self.draft_cache, do_sample=self.do_sample,
                                            logits_processor=warp, row_ids=list(self.running))
            verify_len = self.policy(proposal, self._remaining() - 1)
        steps = 1 + int(verify_len.max())
        drafts = proposal.draft_ids[:, : steps - 1] if proposal is not None else self.anchor.new_zeros(rows, 0)
        inputs = torch.cat([self.anchor[:, None], drafts], dim=1)
        input_valid = torch.arange(steps, device=inputs.device)[None, :] <= verify_len[:, None]
        out = self.target_cache.forward(self.target, inputs, input_valid, self.taps)
        scores = out.logits
        if len(self.warpers):
            scores = self.warpers(None, scores.flatten(0, 1)).view_as(scores)
        if self.do_sample:
            draft_probs = proposal.draft_probs[:, : steps - 1] if proposal is not None else scores[:, :0]
            result = verify_sampling(drafts, draft_probs, torch.softmax(scores, dim=-1), verify_len)
        else:
            result = verify_greedy(drafts, scores.argmax(dim=-1), verify_len)
        events, committed = [], []
        for a, rid in enumerate(self.running):
            m = int(result.num_accepted[a])
            kept = self._commit(rid, [*drafts[a, :m].tolist(), int(result.next_token[a])])
            events.append((rid, kept))
            committed.append(len(kept))
        self.records.append(EngineRoundRecord(rows, verify_len.tolist(), committed, 0.0))
        kept_slots = 1 + result.num_accepted
        self.target_cache.commit_last(steps, kept_slots)
        if self.drafter is not None:
            valid = torch.arange(steps, device=inputs.device)[None, :] < kept_slots[:, None]
            self.drafter.extend_context(self.draft_cache, out.features, valid)
        self.anchor = result.next_token
        return events

    def _commit(self, rid: int, tokens: list[int]) -> list[int]:
        request = self.requests[rid]
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
        keep = [a for a, rid in enumerate(self.running) if not self.requests[rid].finished]
        if len(keep) == len(self.running):
            return
        self.running = [self.running[a] for a in keep]
        if not keep:
            self.anchor = self.target_cache = self.draft_cache = None
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.anchor.device)
        self.anchor = self.anchor.index_select(0, index)
        self.target_cache.select_rows(index)
        if self.draft_cache is not None:
            self.draft_cache = self.draft_cache.select_rows(index)
