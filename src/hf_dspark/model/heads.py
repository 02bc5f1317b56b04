"""Sequential heads (Eqs. 5-6), the confidence head (Eq. 7), and the one table of sequential-head types.

The head table (`register_head` / `get_head` / `available_heads`) maps a config's `head_type` to its `HeadSpec`:
the module built for it and its declared properties (whether it conditions on the previous token, the parameters
it stores, its spelling in engine checkpoints, its name in errors and model cards). Modeling, configuration,
interop, training and the CLI read it; adding a head is one class and one `register_head` line
(docs/adding-a-drafter-head.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PretrainedConfig

from ..ops.functional import confidence_logit, markov_transition_bias, rnn_head_step

HEAD_MODULE = "markov_head"  # the drafter's attribute (and state-dict prefix) of its sequential head


class MarkovHead(nn.Module):
    """Eq. (5): a rank-r bigram bias B(x_{k-1}, ·) = W2ᵀ W1[x_{k-1}].

    `markov_w1` `[V, r]` embeds the previous token; `markov_w2` `[V_draft, r]` projects back to logits over the
    draft vocabulary (`V_draft = V` without one; stored as in the serving engines' checkpoints). The head is
    stateless: `step` ignores and returns `state`.
    """

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(config.vocab_size, config.markov_rank)
        self.markov_w2 = nn.Linear(config.markov_rank, config.num_draft_tokens, bias=False)

    def embed_previous(self, prev_tokens: torch.Tensor) -> torch.Tensor:
        """W1[x_{k-1}]: `[...]` token ids -> `[..., r]`."""
        return self.markov_w1(prev_tokens)

    def init_state(self, batch_shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor | None:
        return None

    def step(
        self, state: torch.Tensor | None, prev_embedding: torch.Tensor, hidden: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """One position: returns (state, B_k `[..., V]`)."""
        return state, markov_transition_bias(prev_embedding, self.markov_w2.weight)

    def teacher_forced_bias(self, prev_embedding: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """B_k for every position at once from gold previous tokens: `[..., γ, r]` -> `[..., γ, V]`."""
        return markov_transition_bias(prev_embedding, self.markov_w2.weight)


class RNNHead(MarkovHead):
    """Eq. (6): a GRU-style state over [s_{k-1}; W1[x_{k-1}]; h_k], bias B_k = W2ᵀ tanh(W_o z_k).

    The gate, candidate and output projections are packed in `joint_proj` (`[3r, 2r + d]`, with bias).
    """

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__(config)
        rank = config.markov_rank
        self.joint_proj = nn.Linear(2 * rank + config.hidden_size, 3 * rank, bias=True)

    def init_state(self, batch_shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        return like.new_zeros(*batch_shape, self.markov_w1.embedding_dim)

    def step(
        self, state: torch.Tensor | None, prev_embedding: torch.Tensor, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if state is None:
            state = self.init_state(tuple(prev_embedding.shape[:-1]), prev_embedding)
        new_state, output = rnn_head_step(state, prev_embedding, hidden, self.joint_proj.weight, self.joint_proj.bias)
        return new_state, markov_transition_bias(output, self.markov_w2.weight)

    def teacher_forced_bias(self, prev_embedding: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Runs the recurrence over the γ axis (dimension -2) with gold previous tokens."""
        state = self.init_state(tuple(prev_embedding.shape[:-2]), prev_embedding)
        biases = []
        for k in range(prev_embedding.shape[-2]):
            state, bias = self.step(state, prev_embedding[..., k, :], hidden[..., k, :])
            biases.append(bias)
        return torch.stack(biases, dim=-2)


class ConfidenceHead(nn.Module):
    """Eq. (7): c_k = σ(wᵀ[h_k; W1[x_{k-1}]] + b); returns the logit (the sigmoid and STS come later)."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        extra = config.markov_rank if config.confidence_with_markov else 0
        self.with_markov = config.confidence_with_markov
        self.proj = nn.Linear(config.hidden_size + extra, 1, bias=True)

    def forward(self, hidden: torch.Tensor, prev_embedding: torch.Tensor | None) -> torch.Tensor:
        """hidden `[..., d]`, prev_embedding `[..., r]` or None -> logits `[...]`."""
        features = hidden
        if self.with_markov:
            if prev_embedding is None:
                raise ValueError("this confidence head sees the Markov embedding but none was given")
            features = torch.cat([hidden, prev_embedding.to(hidden.dtype)], dim=-1)
        return confidence_logit(features, self.proj.weight, self.proj.bias)


ShapeFn = Callable[[int, int, int, int], tuple[int, ...]]  # (vocab, draft_vocab, rank, hidden) -> shape


@dataclass(frozen=True)
class HeadSpec:
    """One sequential-head type and its declared properties.

    Args:
        name: the `DSparkConfig.head_type` spelling (lower-case).
        module: the `nn.Module` class built as `module(config)` at `HEAD_MODULE`; None: no sequential head.
        label: its name in errors and contracts (e.g. "vanilla Markov").
        card: its model-card line, formatted with `rank` (e.g. "Markov head (rank {rank})").
        conditions_on_previous: draft k's distribution depends on the drafted x_{k-1} (drafts are drawn left to
            right); also what lets the confidence head see W1[x_{k-1}] (`confidence_with_markov`).
        parameters: the head's tensors under `HEAD_MODULE.`, each name -> its shape from (V, V_draft, r, d); the
            same names in every engine layout that serves the head.
        export_name: its `markov_head_type` in DeepSpec / speculators / vLLM / TensorRT-LLM configs; None: the
            head is written as `markov_rank: 0` (no head).
    """

    name: str
    module: type[nn.Module] | None
    label: str
    card: str
    conditions_on_previous: bool
    parameters: dict[str, ShapeFn]
    export_name: str | None

    def parameter_shapes(self, vocab: int, draft_vocab: int, rank: int, hidden: int) -> dict[str, tuple[int, ...]]:
        """Full state-dict names (`markov_head.…`) -> shapes of this head's tensors."""
        sizes = (vocab, draft_vocab, rank, hidden)
        return {f"{HEAD_MODULE}.{name}": shape(*sizes) for name, shape in self.parameters.items()}


MARKOV_PARAMETERS: dict[str, ShapeFn] = {
    "markov_w1.weight": lambda v, vd, r, d: (v, r),
    "markov_w2.weight": lambda v, vd, r, d: (vd, r),
}
RNN_PARAMETERS: dict[str, ShapeFn] = {
    **MARKOV_PARAMETERS,
    "joint_proj.weight": lambda v, vd, r, d: (3 * r, 2 * r + d),
    "joint_proj.bias": lambda v, vd, r, d: (3 * r,),
}

_HEADS: dict[str, HeadSpec] = {}


def register_head(spec: HeadSpec, *, overwrite: bool = False) -> None:
    """Make `spec.name` a valid `head_type`. A second registration of a name raises unless `overwrite=True`."""
    if not isinstance(spec, HeadSpec):
        raise TypeError(f"register_head takes a HeadSpec, got {spec!r}.")
    if not spec.name or spec.name != spec.name.lower() or not spec.name.isidentifier():
        raise ValueError(f"a head name must be a lower-case identifier such as 'my_head', got {spec.name!r}.")
    if spec.module is not None and not (isinstance(spec.module, type) and issubclass(spec.module, nn.Module)):
        raise TypeError(f"head {spec.name!r}: module must be an nn.Module class or None, got {spec.module!r}.")
    if spec.name in _HEADS and _HEADS[spec.name] != spec and not overwrite:
        raise ValueError(f"head {spec.name!r} is already registered; pass overwrite=True to replace it.")
    _HEADS[spec.name] = spec


def available_heads() -> tuple[str, ...]:
    """Registered head types, in registration order."""
    return tuple(_HEADS)


def get_head(name: str) -> HeadSpec:
    """The `HeadSpec` of `head_type` `name`; a `ValueError` listing the registered heads otherwise."""
    if name not in _HEADS:
        raise ValueError(
            f"unknown sequential head_type {name!r}; choose one of {list(_HEADS)} (or register yours with "
            "hf_dspark.model.heads.register_head, docs/adding-a-drafter-head.md)."
        )
    return _HEADS[name]


def find_exported_head(export_name: str | None, rank: int) -> HeadSpec | None:
    """The head of an engine checkpoint's `markov_head_type` / `markov_rank` (rank 0 or no type: the head exported
    as no head), or None when no registered head is exported under that name (e.g. engines' "gated")."""
    if not rank or export_name in (None, "", "none"):
        export_name = None
    return next((spec for spec in _HEADS.values() if spec.export_name == export_name), None)


def head_from_export(export_name: str | None, rank: int, source: str) -> HeadSpec:
    """`find_exported_head`, or a `ValueError` naming `source` (the file) and the export names hf-dspark reads."""
    head = find_exported_head(export_name, rank)
    if head is not None:
        return head
    exported = sorted(spec.export_name for spec in _HEADS.values() if spec.export_name is not None)
    raise ValueError(f"{source} has markov_head_type={export_name!r}; hf-dspark implements {exported}.")


def build_sequential_head(config: PretrainedConfig) -> nn.Module | None:
    """The sequential head of `config.head_type` (None for a head type without a module)."""
    module = get_head(config.head_type).module
    return None if module is None else module(config)


register_head(HeadSpec("markov", MarkovHead, "vanilla Markov", "Markov head (rank {rank})", True,
                       MARKOV_PARAMETERS, "vanilla"))
register_head(HeadSpec("rnn", RNNHead, "RNN", "RNN head (rank {rank})", True, RNN_PARAMETERS, "rnn"))
register_head(HeadSpec("none", None, "no sequential head", "no sequential head (DFlash-style parallel drafter)",
                       False, {}, None))
