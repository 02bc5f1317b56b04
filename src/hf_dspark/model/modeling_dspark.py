"""DSparkModel, the drafter network: context projection (Eq. 2), KV injection (Eq. 3), semi-autoregressive proposal
(Eqs. 4-7).

This is the network alone: its forward, `propose`, caches, the target's shared embedding and LM head
(`bind_target`), and transformers' native `from_pretrained` / `save_pretrained`. The public drafter,
`hf_dspark.DSparkDrafter` (`hf_dspark/drafter.py`), subclasses it with what needs the layers above: loading other
layouts, the Hub remote-code shim on save, routing the target's `generate`, and the last call's statistics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import GenerationConfig, PreTrainedModel
from transformers.utils import logging

from ..io_utils import check_folder_path
from ..ops.functional import calibrated_confidence, greedy_token_ids, semi_autoregressive_logits
from .binding import STOCK_LOOP_READS, stock_loop_error, validate_target_shape
from .cache import DSparkDraftCache
from .configuration_dspark import DSparkConfig
from .draft_vocab import (
    d2t_from_token_ids,
    normalise_token_ids,
    scatter_to_target_vocab,
    t2d_from_token_ids,
    target_to_draft_index,
    token_ids_from_d2t,
)
from .heads import ConfidenceHead, MarkovHead, build_sequential_head
from .layers import DSparkDecoderLayer, DSparkRMSNorm, DSparkRope
from .modeling_outputs import DraftLogitsProcessor, DSparkDrafterOutput, DSparkProposal

__all__ = ["DSparkDrafterOutput", "DSparkModel", "DSparkPreTrainedModel", "DSparkProposal", "DraftLogitsProcessor"]

logger = logging.get_logger(__name__)

def _draw(
    logits: torch.Tensor, do_sample: bool, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One draft position (Eq. 4): p_draft = softmax(logits) `[R, V]`, and a token `[R]` drawn from it (argmax
    when greedy)."""
    p_draft = torch.softmax(logits.float(), dim=-1)
    if do_sample:
        return torch.multinomial(p_draft, 1, generator=generator).squeeze(-1), p_draft
    return greedy_token_ids(logits), p_draft


@dataclass
class _BoundTarget:
    """The target's frozen embedding and LM head, held outside the module tree so they are never saved."""

    embed_tokens: nn.Module
    lm_head: nn.Module
    target_id: int
    name_or_path: str


class DSparkPreTrainedModel(PreTrainedModel):
    config_class = DSparkConfig
    base_model_prefix = "dspark"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = False
    _no_split_modules = ("DSparkDecoderLayer",)

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, DSparkModel) and module.mask_embedding is not None:
            nn.init.normal_(module.mask_embedding, std=self.config.initializer_range)


def generating_model(target: nn.Module) -> nn.Module:
    """The model whose `generate` runs when `target.generate` is called: a PEFT wrapper's base model
    (`get_base_model()`), a `torch.compile` wrapper's original module (`_orig_mod`), else `target` itself."""
    while True:
        inner = getattr(target, "_orig_mod", None)
        if inner is None and callable(getattr(target, "get_base_model", None)):
            inner = target.get_base_model()
        if inner is None or inner is target:
            return target
        target = inner


class DSparkModel(DSparkPreTrainedModel):
    """The DSpark drafter network. Bind it to its target with `bind_target` (or `from_pretrained(path, target=...)`).

    `hf_dspark.DSparkDrafter` is this network as the package ships it (what `generate(assistant_model=...)` takes);
    code that only needs the network checks `isinstance(drafter, DSparkModel)`.
    """

    def __init__(self, config: DSparkConfig) -> None:
        super().__init__(config)
        d = config.hidden_size
        self.fc = nn.Linear(config.num_taps * d, d, bias=False)
        self.hidden_norm = DSparkRMSNorm(d, config.rms_norm_eps)
        self.layers = nn.ModuleList([DSparkDecoderLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = DSparkRMSNorm(d, config.rms_norm_eps)
        self.rotary = DSparkRope(config)
        self.markov_head: MarkovHead | None = build_sequential_head(config)
        self.confidence_head = ConfidenceHead(config) if config.use_confidence_head else None
        self.mask_embedding = nn.Parameter(torch.zeros(d)) if config.mask_token_id is None else None
        if config.draft_vocab_size is not None:  # identity-prefix mapping until restrict_draft_vocab() sets it
            identity = torch.arange(config.draft_vocab_size)
            self.register_buffer("d2t", d2t_from_token_ids(identity))
            self.register_buffer("t2d", t2d_from_token_ids(identity, config.vocab_size))
        self._bound: _BoundTarget | None = None
        self._draft_head: tuple[tuple, torch.Tensor, torch.Tensor | None] | None = None
        self.post_init()

    # ------------------------------------------------------------------ binding
    def save_pretrained(self, save_directory, *args: Any, **kwargs: Any):
        """`PreTrainedModel.save_pretrained` (safetensors, no target embedding/LM head); refuses a path that is a
        file, which transformers only logs."""
        check_folder_path(save_directory, "save_pretrained")
        return super().save_pretrained(save_directory, *args, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, *args: Any, target: nn.Module | None = None, **kw):
        """transformers' `from_pretrained` of a native folder, then `bind_target(target)` when one is given."""
        model = super().from_pretrained(pretrained_model_name_or_path, *args, **kw)
        return model if target is None else model.bind_target(target)

    def bind_target(self, target: PreTrainedModel) -> DSparkModel:
        """Share the target's frozen embedding and LM head; move to its device and dtype."""
        target = generating_model(target)
        validate_target_shape(self.config, target)
        embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
        self._bound = _BoundTarget(embed, lm_head, id(target), str(getattr(target, "name_or_path", "")))
        self.to(device=embed.weight.device, dtype=embed.weight.dtype)
        return self

    @property
    def is_bound(self) -> bool:
        return self._bound is not None

    def bound_to(self, target: nn.Module) -> bool:
        return self._bound is not None and self._bound.target_id == id(generating_model(target))

    def __getattr__(self, name: str) -> Any:
        if name == "generation_config" and self._bound is not None:
            # the assistant's own settings, as transformers' assisted loop and its tests read and set them (a
            # DSpark call refuses the ones it would ignore, `call_checks.explicit_assistant_knobs`)
            self.generation_config = GenerationConfig()
            return self.generation_config
        if name in STOCK_LOOP_READS:  # transformers' own assisted loop: not a DSpark-enabled target
            raise stock_loop_error(self)
        return super().__getattr__(name)

    def _require_bound(self) -> _BoundTarget:
        if self._bound is None:
            raise RuntimeError(
                f"This {type(self).__name__} is not bound to a target model: it shares the target's embedding and LM "
                f"head. Call drafter.bind_target(target) or load with {type(self).__name__}.from_pretrained(path, "
                "target=target)."
            )
        return self._bound

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self._require_bound().embed_tokens(input_ids) * self.config.embedding_multiplier

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """U_k: the target's LM head on drafter hidden states, over the draft vocabulary when there is one.

        hidden `[..., d]` -> fp32 `[..., V_draft]` (`V_draft = V` without a draft vocabulary).
        """
        bound = self._require_bound()
        if self.config.draft_vocab_size is None:
            return bound.lm_head(hidden).float()
        weight, bias = self._draft_head_rows(bound.lm_head)
        return nn.functional.linear(hidden.to(weight.dtype), weight, bias).float()

    # ------------------------------------------------------------------ draft vocabulary
    def draft_token_ids(self) -> torch.Tensor | None:
        """Target ids of the draft vocabulary `[V_draft]` (sorted); `None` when drafting over the full vocabulary."""
        return token_ids_from_d2t(self.d2t) if self.config.draft_vocab_size is not None else None

    def _draft_head_rows(self, lm_head: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The target LM head's rows (and bias) for the draft vocabulary, gathered once and cached (frozen)."""
        weight = lm_head.weight
        key = (weight.data_ptr(), weight.dtype, weight.device, self.d2t.data_ptr(), self.d2t._version)
        if self._draft_head is None or self._draft_head[0] != key:
            ids = self.draft_token_ids().to(weight.device)
            bias = getattr(lm_head, "bias", None)
            rows = weight.detach()[ids].contiguous()
            self._draft_head = (key, rows, bias.detach()[ids] if bias is not None else None)
        return self._draft_head[1], self._draft_head[2]

    @torch.no_grad()
    def restrict_draft_vocab(self, token_ids: torch.Tensor | list[int]) -> DSparkModel:
        """Draft only over `token_ids` (target ids): keeps those rows of the Markov `W2`, sets `d2t` / `t2d` and
        `config.draft_vocab_size`. Works from the full vocabulary or from a larger draft vocabulary containing them.
        """
        ids = normalise_token_ids(token_ids, self.config.vocab_size)
        current = self.draft_token_ids()
        if current is None:
            rows = ids
        else:
            rows = target_to_draft_index(self.t2d)[ids.to(self.t2d.device)]
            if bool((rows < 0).any()):
                raise ValueError("the new draft vocabulary must be a subset of the drafter's current one.")
        if self.markov_head is not None:
            w2 = self.markov_head.markov_w2
            new = nn.Linear(w2.in_features, ids.numel(), bias=False, device=w2.weight.device, dtype=w2.weight.dtype)
            new.weight.copy_(w2.weight[rows.to(w2.weight.device)])
            self.markov_head.markov_w2 = new
        device = self.fc.weight.device
        if ids.numel() == self.config.vocab_size:
            self.config.draft_vocab_size = None
            for name in ("d2t", "t2d"):
                self._buffers.pop(name, None)
        else:
            self.config.draft_vocab_size = ids.numel()
            self.register_buffer("d2t", d2t_from_token_ids(ids).to(device))
            self.register_buffer("t2d", t2d_from_token_ids(ids, self.config.vocab_size).to(device))
        self._draft_head = None
        return self

    # ------------------------------------------------------------------ context (Eqs. 2-3)
    def project_context(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """Eq. (2): H_ctx = RMSNorm(W_c [H^(l1); ...; H^(ln)]). `[..., n·d]` -> `[..., d]`."""
        return self.hidden_norm(self.fc(target_hidden.to(self.fc.weight.dtype)))

    def init_cache(self, batch_size: int, capacity: int = 64) -> DSparkDraftCache:
        ref = self.fc.weight
        return DSparkDraftCache.empty(
            len(self.layers), batch_size, self.config.num_key_value_heads, self.config.head_dim, ref.dtype,
            ref.device, capacity,
        )

    @torch.no_grad()
    def extend_context(self, cache: DSparkDraftCache, target_hidden: torch.Tensor, valid: torch.Tensor,
                       counts: list[int] | None = None) -> None:
        """Append newly committed tokens' context features to each row's cache.

        target_hidden: `[R, n, n_taps·d]` concatenated tapped-layer outputs; valid: bool `[R, n]` marking which
        entries are real committed tokens of that row, in order (padding anywhere is skipped); counts: each row's
        number of valid entries as host ints, when the caller knows them (None: read from `valid`, one sync).
        """
        if counts is None:
            counts = valid.sum(dim=1).tolist()
        n = max(counts, default=0)
        if n == 0:
            return
        order = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)
        hidden = target_hidden.gather(1, order[..., None].expand_as(target_hidden))[:, :n]
        cache.reserve(n)
        ctx = self.project_context(hidden)
        cos, sin = self.rotary(cache.positions_for(n), ctx.dtype)
        for i, layer in enumerate(self.layers):
            keys, values = layer.self_attn.project_kv(ctx, cos, sin)
            cache.write(i, keys, values)
        cache.advance(valid.sum(dim=1), counts)

    # ------------------------------------------------------------------ block forward
    def _block_inputs(self, anchor_ids: torch.Tensor) -> torch.Tensor:
        """Block [x_0, mask, ..., mask]: `[...]` anchors -> `[..., slots, d]` embeddings.

        slots = γ (anchor-first DSpark layout) or γ + 1 (DFlash layout, `sample_from_anchor=False`).
        """
        anchor = self.embed(anchor_ids)[..., None, :]
        if self.config.mask_token_id is not None:
            mask_ids = torch.full_like(anchor_ids, self.config.mask_token_id)
            mask = self.embed(mask_ids)[..., None, :]
        else:
            mask = self.mask_embedding.to(anchor.dtype).expand_as(anchor)
        slots = self.config.num_block_slots
        return torch.cat([anchor, mask.expand(*anchor.shape[:-2], slots - 1, anchor.shape[-1])], dim=-2)

    def _run_layers(self, hidden, positions, ctx_keys_fn, attn_mask, block_slots=None) -> torch.Tensor:
        """hidden `[B, Q, d]`; positions `[B, Q]`; ctx_keys_fn(layer_idx) -> (keys, values); mask `[B, Q, C+Q]`
        (or `[B, N, C]` per block with `block_slots`, see `DSparkAttention.forward`)."""
        cos, sin = self.rotary(positions, hidden.dtype)
        for i, layer in enumerate(self.layers):
            ctx_keys, ctx_values = ctx_keys_fn(i)
            hidden = layer(hidden, cos, sin, ctx_keys, ctx_values, attn_mask, block_slots)
        return self.norm(hidden)

    def block_hidden_states(self, anchor_ids: torch.Tensor, cache: DSparkDraftCache) -> torch.Tensor:
        """h_1..h_γ for one block per row after each row's cached context: `[R]` -> `[R, γ, d]`.

        The block's slots sit at positions anchor_pos, anchor_pos + 1, ...; h_k is read from slot k − 1 (DSpark)
        or slot k (DFlash layout, whose slot 0 only carries the anchor).
        """
        slots, first = self.config.num_block_slots, self.config.first_draft_slot
        hidden = self._block_inputs(anchor_ids).to(self.fc.weight.dtype)
        positions = cache.positions_for(slots)
        ctx_mask = cache.key_mask()[:, None, :].expand(-1, slots, -1)
        block_mask = torch.ones(hidden.shape[0], slots, slots, dtype=torch.bool, device=hidden.device)
        attn_mask = torch.cat([ctx_mask, block_mask], dim=-1)
        out = self._run_layers(hidden, positions, lambda i: (cache.keys[i], cache.values[i]), attn_mask)
        return out[:, first : first + self.config.block_size]

    # ------------------------------------------------------------------ proposal (Eqs. 4-7)
    def confidence_temperatures(self, greedy: bool, device) -> torch.Tensor:
        """The STS temperatures `[γ]` of this decoding mode on `device`, uploaded once per (values, device) without
        blocking the host (pinned staging on CUDA)."""
        values = tuple(self.config.temperatures_for(greedy))
        key = (values, str(device))
        cached = self.__dict__.setdefault("_temperature_tensors", {})
        if key not in cached:
            host = torch.tensor(values, dtype=torch.float32)
            if torch.device(device).type == "cuda":
                host = host.pin_memory()
            cached[key] = host.to(device, non_blocking=True)
        return cached[key]

    @torch.no_grad()
    def propose(
        self,
        anchor_ids: torch.Tensor,
        cache: DSparkDraftCache,
        *,
        do_sample: bool = False,
        logits_processor: DraftLogitsProcessor | None = None,
        generator: torch.Generator | None = None,
        return_probs: bool | None = None,
        row_ids: list[int] | None = None,
        histories: list[torch.Tensor] | None = None,
    ) -> DSparkProposal:
        """Draft γ tokens per row: x_k ~ softmax(process(U_k + B_k(x_0, x_<k))), left to right (Eq. 4).

        anchor_ids: `[R]` last committed token of each row; cache: context of everything before the anchor.
        `logits_processor(k, drafts_so_far [R, k], logits [R, V])` applies the same processors the target's
        logits get (temperature, top-k/p, repetition penalty...) on the same prefix; one whose `reads_token_ids` is
        False runs over the draft vocabulary. Greedy picks the argmax.
        """
        return_probs = do_sample if return_probs is None else return_probs
        hidden = self.block_hidden_states(anchor_ids, cache)
        base_logits = self.lm_logits(hidden)
        rows, gamma, vocab = anchor_ids.shape[0], self.config.block_size, self.config.vocab_size
        drafts = anchor_ids.new_empty(rows, gamma)
        token_probs = base_logits.new_empty(rows, gamma)
        conf_logits = base_logits.new_empty(rows, gamma) if self.confidence_head is not None else None
        head, state, prev = self.markov_head, None, anchor_ids
        draft_ids = self.draft_token_ids()
        # Over a draft vocabulary, drafting stays in draft ids (process, soft-max, pick, then d2t) unless a logits
        # processor reads token ids (penalties, EOS floors...): those see target-vocabulary logits, −inf outside
        # the subset. Either way p_draft = 0 outside the draft vocabulary.
        reads_ids = logits_processor is not None and getattr(logits_processor, "reads_token_ids", True)
        in_draft_ids = draft_ids is not None and not reads_ids
        all_probs = None
        if return_probs:
            all_probs = (base_logits.new_zeros if in_draft_ids else base_logits.new_empty)(rows, gamma, vocab)
        for k in range(gamma):
            prev_embedding = head.embed_previous(prev) if head is not None else None
            bias = None
            if head is not None:
                state, bias = head.step(state, prev_embedding, hidden[:, k])
            logits = semi_autoregressive_logits(base_logits[:, k], bias)
            if draft_ids is not None and not in_draft_ids:
                logits = scatter_to_target_vocab(logits, draft_ids, vocab)
            if logits_processor is not None:
                logits = logits_processor(k, drafts[:, :k], logits)
            token, probs = _draw(logits, do_sample, generator)
            token_probs[:, k] = probs.gather(-1, token[:, None]).squeeze(-1)
            if all_probs is not None and in_draft_ids:
                all_probs[:, k, draft_ids] = probs.to(all_probs.dtype)
            elif all_probs is not None:
                all_probs[:, k] = probs
            if in_draft_ids:
                token = draft_ids[token]
            drafts[:, k] = token
            if conf_logits is not None:
                conf_logits[:, k] = self.confidence_head(hidden[:, k], prev_embedding).float()
            prev = token
        confidence = None
        if conf_logits is not None:
            confidence = calibrated_confidence(conf_logits, self.confidence_temperatures(not do_sample, hidden.device))
        return DSparkProposal(drafts, all_probs, token_probs, confidence, conf_logits)

    # ------------------------------------------------------------------ teacher-forced (training)
    def forward(
        self,
        target_hidden: torch.Tensor,
        input_ids: torch.Tensor,
        anchor_positions: torch.Tensor,
        context_mask: torch.Tensor | None = None,
        return_logits: bool = True,
        block_sparse: bool = True,
        **kwargs: Any,
    ) -> DSparkDrafterOutput:
        """Teacher-forced forward over many anchor blocks per sequence.

        target_hidden: `[S, L, n_taps·d]`; input_ids: `[S, L]`; anchor_positions: `[S, N]` (−1 marks an unused
        block slot); context_mask: bool `[S, L]` of real tokens. Block n of sequence s sees the context tokens
        before its anchor and its own γ slots, nothing else. The sequential head's bias at slot k uses the gold
        previous token input_ids[a + k − 1] (the anchor for k = 1). `block_sparse` (default) computes that
        attention block by block (N·slots × (L + slots) scores); False runs the equivalent dense masked attention
        over [context ‖ all blocks] (N·slots × (L + N·slots) scores), kept as the reference.
        """
        seqs, length = input_ids.shape
        gamma, n_blocks = self.config.block_size, anchor_positions.shape[1]
        slots, first = self.config.num_block_slots, self.config.first_draft_slot  # slots = γ (+1 for DFlash)
        device = input_ids.device
        used = anchor_positions >= 0
        anchors = anchor_positions.clamp_min(0)
        offsets = torch.arange(slots, device=device)
        slot_pos = anchors[..., None] + offsets  # [S, N, slots]
        prev_pos = slot_pos[..., :gamma].clamp_max(length - 1)  # a + k − 1 for k = 1..γ
        prev_ids = input_ids.gather(1, prev_pos.flatten(1)).view(seqs, n_blocks, gamma)

        ctx = self.project_context(target_hidden)
        ctx_pos = torch.arange(length, device=device)[None].expand(seqs, -1)
        cos, sin = self.rotary(ctx_pos, ctx.dtype)
        ctx_kv = [layer.self_attn.project_kv(ctx, cos, sin) for layer in self.layers]

        hidden = self._block_inputs(prev_ids[..., 0]).to(ctx.dtype).flatten(1, 2)  # [S, N·slots, d]
        sees_ctx = torch.arange(length, device=device)[None, None, :] < anchors.view(seqs, n_blocks, 1)
        if context_mask is not None:
            sees_ctx = sees_ctx & context_mask[:, None, :].bool()
        sees_ctx = sees_ctx & used[..., None]  # [S, N, L]; each block also sees its own slots
        if block_sparse:
            out = self._run_layers(hidden, slot_pos.flatten(1), lambda i: ctx_kv[i], sees_ctx, block_slots=slots)
        else:  # the same attention as one dense masked SDPA over [context ‖ all blocks] (reference, benchmarks)
            block_id = torch.arange(n_blocks, device=device).repeat_interleave(slots)
            sees_block = (block_id[:, None] == block_id[None, :])[None].expand(seqs, -1, -1)
            mask = torch.cat([sees_ctx.repeat_interleave(slots, dim=1), sees_block], dim=-1)
            out = self._run_layers(hidden, slot_pos.flatten(1), lambda i: ctx_kv[i], mask)
        out = out.view(seqs, n_blocks, slots, -1)[:, :, first : first + gamma]

        head = self.markov_head
        prev_embedding = head.embed_previous(prev_ids) if head is not None else None
        logits = None
        if return_logits:
            bias = head.teacher_forced_bias(prev_embedding, out) if head is not None else None
            logits = semi_autoregressive_logits(self.lm_logits(out), bias)
        conf = self.confidence_head(out, prev_embedding).float() if self.confidence_head is not None else None
        return DSparkDrafterOutput(logits=logits, confidence_logits=conf, hidden_states=out)

    def num_trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)
