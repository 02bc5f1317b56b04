"""Checks and conversions of `DSparkEngine`'s arguments and requests, run before anything is queued or built."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from ..generation.options import DSparkGenerationOptions
from ..generation.policy import policy_from_options
from ..scheduling.registry import NO_SPECULATION, available_policies, canonical_policy_name
from ..scheduling.verification_policy import VerificationPolicy
from ..target.checks import rope_reach_refusal, rope_threshold

if TYPE_CHECKING:
    from ..proposers.base import DraftModel


def sampling_warpers(
    do_sample: bool, temperature: float, top_k: int | None, top_p: float | None
) -> LogitsProcessorList:
    """The warpers the engine applies to every request when sampling (none for greedy decoding)."""
    warpers = LogitsProcessorList()
    if do_sample:
        if temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(temperature))
        if top_k:
            warpers.append(TopKLogitsWarper(top_k))
        if top_p is not None and top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p))
    return warpers


def check_engine_arguments(policy, drafter, max_running) -> None:
    """Refuse a bad policy / drafter pairing or batch size before anything runs."""
    if not isinstance(policy, (str, VerificationPolicy)):
        raise ValueError(f"policy must be 'none', a policy name or a VerificationPolicy; got {type(policy).__name__}.")
    if policy != "none" and drafter is None:
        raise ValueError(f"policy {policy!r} needs a drafter; use policy='none' for plain decoding")
    gamma = getattr(getattr(drafter, "config", None), "block_size", None)
    if isinstance(policy, VerificationPolicy) and gamma is not None and policy.block_size != gamma:
        raise ValueError(
            f"the policy was built for block_size={policy.block_size} but the drafter drafts γ = {gamma} "
            f"tokens; build it with block_size={gamma}."
        )
    if isinstance(max_running, bool) or not isinstance(max_running, int) or max_running < 1:
        raise ValueError(f"max_running must be an int >= 1 (requests in the running batch), got {max_running!r}.")


def named_policy(
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


def check_rope_reach(target, gamma: int, prompt_length: int, max_new_tokens: int) -> None:
    """Refuse a request whose forwards could cross a length-dependent RoPE threshold: the running rows share
    each forward, so one row past it would change every row's frequencies (`target.checks.rope_reach_refusal`)."""
    found = rope_threshold(target.config.get_text_config(decoder=True))
    if found is None:
        return
    slots = f", γ = {gamma} draft slots" if gamma else ""
    reason = rope_reach_refusal(
        target,
        prompt_length + max_new_tokens + gamma,
        f"This request ({prompt_length} prompt tokens, max_new_tokens={max_new_tokens}{slots})",
        f"Keep prompt + max_new_tokens at most {found[1] - gamma} tokens per request, or serve this target "
        "without DSparkEngine.",
    )
    if reason is not None:
        raise ValueError(reason)


def prompt_tensor(prompt_ids, vocab_size: int) -> torch.Tensor:
    """One prompt as a 1-D long tensor: a list of ints, a 1-D integer tensor or a `[1, L]` one; ids in 0..V-1."""
    if isinstance(prompt_ids, (str, bytes)):
        raise ValueError(
            "add_request takes token ids (a list of ints or an integer tensor), not text: tokenize the "
            "prompt first (chat template applied)."
        )
    prompt = torch.as_tensor(prompt_ids)
    if prompt.numel() == 0:
        raise ValueError("a request needs at least one prompt token and max_new_tokens >= 1")
    if prompt.dtype.is_floating_point or prompt.dtype.is_complex or prompt.dtype == torch.bool:
        raise ValueError(f"prompt ids must be integers, got dtype {prompt.dtype}.")
    if prompt.dim() == 2 and prompt.shape[0] == 1:
        prompt = prompt[0]
    if prompt.dim() != 1:
        raise ValueError(
            f"add_request takes one prompt (a 1-D sequence or [1, L]), got shape {tuple(prompt.shape)}; "
            "call add_request once per row of a batch."
        )
    if int(prompt.min()) < 0 or int(prompt.max()) >= vocab_size:
        bad = prompt[(prompt < 0) | (prompt >= vocab_size)].tolist()
        raise ValueError(f"prompt token ids {bad[:5]} are outside the target's vocabulary 0..{vocab_size - 1}.")
    return prompt.long().cpu().clone()  # the engine's own copy: the caller may reuse its buffer


class RequestHistories(Sequence):
    """The token histories of `requests` (`EngineRequest`s: prompt, then the generated tokens) as they stand when
    this is built, each concatenated only when read: a round whose drafter and processors read none pays nothing
    per request."""

    def __init__(self, requests: Sequence) -> None:
        self.requests = requests
        self.lengths = [len(request.generated) for request in requests]

    def __len__(self) -> int:
        return len(self.requests)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        request = self.requests[index]
        return torch.cat([request.prompt_ids, request.prompt_ids.new_tensor(request.generated[: self.lengths[index]])])
