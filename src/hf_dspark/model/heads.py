"""Sequential heads (Eqs. 5-6) and the confidence head (Eq. 7)."""

from __future__ import annotations

import torch
from torch import nn

from ..ops.functional import confidence_logit, markov_transition_bias, rnn_head_step
from .configuration_dspark import DSparkConfig


class MarkovHead(nn.Module):
    """Eq. (5): a rank-r bigram bias B(x_{k-1}, ·) = W2ᵀ W1[x_{k-1}].

    `markov_w1` `[V, r]` embeds the previous token; `markov_w2` `[V_draft, r]` projects back to logits over the
    draft vocabulary (`V_draft = V` without one; stored as in the serving engines' checkpoints). The head is
    stateless: `step` ignores and returns `state`.
    """

    def __init__(self, config: DSparkConfig) -> None:
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

    def __init__(self, config: DSparkConfig) -> None:
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

    def __init__(self, config: DSparkConfig) -> None:
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


def build_sequential_head(config: DSparkConfig) -> MarkovHead | None:
    if config.head_type == "markov":
        return MarkovHead(config)
    if config.head_type == "rnn":
        return RNNHead(config)
    return None
