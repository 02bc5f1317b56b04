"""DSpark drafter configuration (docs/method.md, section 3)."""

from __future__ import annotations

import math
from typing import Any

from transformers import PreTrainedConfig
from transformers.activations import ACT2FN
from transformers.utils import logging

from .heads import get_head

logger = logging.get_logger(__name__)

SOURCE_LAYOUTS = ("native", "deepspec", "dflash", "speculators")

# Tap id of the embedding output (hidden_states[0]), as DeepSpec spells it; decoder layer i is hidden_states[i + 1].
EMBEDDING_TAP = -1

# Families whose decoder layers carry per-head RMSNorms on queries and keys.
_QK_NORM_FAMILIES = ("qwen3", "qwen3_moe", "gemma3", "gemma3_text", "olmo2", "olmo3")


def default_target_layer_ids(num_target_layers: int, num_taps: int = 5) -> list[int]:
    """Evenly spaced decoder-layer indices from 1 to L-3 (docs/method.md, section 3), never the last layer."""
    if num_target_layers < 3:
        raise ValueError(
            f"The target has {num_target_layers} decoder layers; DSpark taps layers 1..L-3 and needs at least 3. "
            "Pass target_layer_ids explicitly for very shallow targets."
        )
    low, high = 1, max(1, num_target_layers - 3)
    count = max(1, min(num_taps, high - low + 1))
    if count == 1:
        return [low]
    return sorted({round(low + i * (high - low) / (count - 1)) for i in range(count)})


def _check_sizes(**sizes: Any) -> None:
    """Every size is an int >= 1 (None allowed only for head_dim, derived from the others)."""
    for name, value in sizes.items():
        if value is None and name == "head_dim":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")


def _check_shapes(target_layer_ids: Any, heldout_acceptance: Any, rms_norm_eps: Any) -> None:
    """target_layer_ids: None or a list of ints; heldout_acceptance: None or {mode: [rates]}; rms_norm_eps > 0."""
    if target_layer_ids is not None and (
        isinstance(target_layer_ids, (str, bytes)) or not hasattr(target_layer_ids, "__iter__")
        or any(isinstance(i, bool) or not isinstance(i, int) for i in target_layer_ids)
    ):
        raise ValueError(f"target_layer_ids must be a list of target layer indices (ints), got {target_layer_ids!r}.")
    if heldout_acceptance is not None and not isinstance(heldout_acceptance, dict):
        raise ValueError("heldout_acceptance must map a decoding mode ('greedy', 'sampling') to per-position rates, "
                         f"got {heldout_acceptance!r}.")
    if isinstance(rms_norm_eps, bool) or not isinstance(rms_norm_eps, (int, float)) or not rms_norm_eps > 0:
        raise ValueError(f"rms_norm_eps must be a number > 0, got {rms_norm_eps!r}.")


class DSparkConfig(PreTrainedConfig):
    """Configuration of a DSpark drafter.

    Args:
        block_size (`int`, defaults to 7):
            γ, the number of draft positions proposed per round (anchor-first layout: γ inputs give γ drafts).
        num_hidden_layers (`int`, defaults to 2):
            Number of drafter decoder layers.
        target_layer_ids (`list[int]`, *optional*):
            0-based indices of the target decoder layers whose outputs form the context features (Eq. 2);
            -1 taps the embedding output (`hidden_states[0]`, as DeepSpec spells it). Defaults to 5 evenly spaced
            layers from 1 to L-3. The last layer may not be tapped.
        num_target_layers (`int`):
            Number of decoder layers of the target (L).
        head_type (`str`, defaults to `"markov"`):
            Sequential head: `"markov"` (Eq. 5), `"rnn"` (Eq. 6) or `"none"` (pure parallel, the DFlash baseline).
        markov_rank (`int`, defaults to 64):
            Rank r of the Markov factorisation W1 (V×r), W2 (V×r). Used by both the Markov and the RNN head.
        use_confidence_head (`bool`, defaults to `True`):
            Whether the drafter predicts per-position confidences (Eq. 7).
        confidence_with_markov (`bool`, defaults to `True`):
            Whether the confidence head also sees W1[x_{k-1}] (needs a Markov or RNN head).
        calibration_temperatures (`list[float]`, *optional*):
            STS temperatures T_k for sampled decoding, one per position (default 1.0 each).
        calibration_temperatures_greedy (`list[float]`, *optional*):
            STS temperatures for greedy decoding; when unset the sampling temperatures are used.
        heldout_acceptance (`dict[str, list[float]]`, *optional*):
            Conditional acceptance per draft position, P(draft k accepted | drafts before it accepted), measured
            on held-out prompts by `hf-dspark calibrate`, keyed by decoding mode (`"greedy"`, `"sampling"`). The
            `"auto"` policy starts from it for a drafter it has not observed yet (default: 0.5 per position,
            weakly held).
        mask_token_id (`int`, *optional*):
            Token id whose (frozen) target embedding fills the mask slots. When `None` the drafter learns its
            own mask embedding.
        sample_from_anchor (`bool`, defaults to `True`):
            Block convention. `True` (DSpark, what hf-dspark trains): the block is [x_0, mask×(γ−1)] and slot k
            predicts the token after it, so γ slots give γ drafts. `False` (z-lab DFlash): the block is
            [x_0, mask×γ] and slot k predicts the token at its own position, so γ + 1 slots give γ drafts (slot 0
            drafts nothing). `block_size` is γ, the drafts per round, in both conventions (a DFlash checkpoint's
            `block_size` counts slots: γ + 1). `False` is only accepted with `source_layout` "dflash" or
            "deepspec" (checkpoints trained elsewhere). Always recorded for serving engines.
        source_layout (`str`, defaults to `"native"`):
            Layout the weights were first read from: "native" (trained here), "deepspec", "dflash" or
            "speculators".
        hidden_size, num_attention_heads, num_key_value_heads, head_dim, intermediate_size, rms_norm_eps,
        hidden_act, rope_parameters, max_position_embeddings, attention_bias, use_qk_norm, vocab_size:
            Target-shape fields the drafter layers copy.
        embedding_multiplier (`float`, defaults to 1.0):
            Scale applied to looked-up target embeddings (sqrt(hidden_size) for Gemma families).
        target_model_type (`str`, *optional*):
            `model_type` of the target this drafter was built for.
        draft_vocab_size (`int`, *optional*):
            Size of the draft vocabulary (EAGLE-3 style). `None` drafts over the full target vocabulary. When set,
            the LM-head rows and the Markov head's `W2` are restricted to these tokens (the `d2t` / `t2d` buffers
            of the drafter map them), while `W1` (the previous-token embedding) stays on the full vocabulary.
            p_draft is zero outside the draft vocabulary, so verification stays lossless.
    """

    model_type = "dspark"

    def __init__(
        self,
        block_size: int = 7,
        num_hidden_layers: int = 2,
        target_layer_ids: list[int] | None = None,
        num_target_layers: int = 30,
        head_type: str = "markov",
        markov_rank: int = 64,
        use_confidence_head: bool = True,
        confidence_with_markov: bool = True,
        calibration_temperatures: list[float] | None = None,
        calibration_temperatures_greedy: list[float] | None = None,
        heldout_acceptance: dict[str, list[float]] | None = None,
        mask_token_id: int | None = None,
        sample_from_anchor: bool = True,
        source_layout: str = "native",
        hidden_size: int = 576,
        num_attention_heads: int = 9,
        num_key_value_heads: int = 3,
        head_dim: int | None = None,
        intermediate_size: int = 1536,
        rms_norm_eps: float = 1e-5,
        hidden_act: str = "silu",
        rope_parameters: dict[str, Any] | None = None,
        max_position_embeddings: int = 8192,
        attention_bias: bool = False,
        use_qk_norm: bool = False,
        vocab_size: int = 49152,
        embedding_multiplier: float = 1.0,
        target_model_type: str | None = None,
        initializer_range: float = 0.02,
        draft_vocab_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        _check_sizes(block_size=block_size, num_hidden_layers=num_hidden_layers, num_target_layers=num_target_layers,
                     hidden_size=hidden_size, num_attention_heads=num_attention_heads,
                     num_key_value_heads=num_key_value_heads, intermediate_size=intermediate_size,
                     max_position_embeddings=max_position_embeddings, vocab_size=vocab_size, head_dim=head_dim)
        _check_shapes(target_layer_ids, heldout_acceptance, rms_norm_eps)
        self.block_size = block_size
        self.num_hidden_layers = num_hidden_layers
        self.num_target_layers = num_target_layers
        self.target_layer_ids = (
            list(target_layer_ids) if target_layer_ids is not None else default_target_layer_ids(num_target_layers)
        )
        self.head_type = head_type
        self.markov_rank = markov_rank
        self.use_confidence_head = use_confidence_head
        self.confidence_with_markov = confidence_with_markov and get_head(head_type).conditions_on_previous
        self.calibration_temperatures = (
            [float(t) for t in calibration_temperatures] if calibration_temperatures else [1.0] * block_size
        )
        self.calibration_temperatures_greedy = (
            [float(t) for t in calibration_temperatures_greedy] if calibration_temperatures_greedy else None
        )
        self.heldout_acceptance = (
            {str(mode): [float(q) for q in rates] for mode, rates in heldout_acceptance.items()}
            if heldout_acceptance else None
        )
        self.mask_token_id = mask_token_id
        self.sample_from_anchor = bool(sample_from_anchor)
        self.source_layout = source_layout
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim if head_dim is not None else hidden_size // num_attention_heads
        self.intermediate_size = intermediate_size
        self.rms_norm_eps = rms_norm_eps
        self.hidden_act = hidden_act
        default_rope = {"rope_type": "default", "rope_theta": 1e4}
        self.rope_parameters = dict(rope_parameters) if rope_parameters else default_rope
        self.max_position_embeddings = max_position_embeddings
        self.attention_bias = attention_bias
        self.use_qk_norm = use_qk_norm
        self.vocab_size = vocab_size
        self.embedding_multiplier = float(embedding_multiplier)
        self.target_model_type = target_model_type
        self.initializer_range = initializer_range
        self.draft_vocab_size = None if draft_vocab_size in (None, vocab_size) else int(draft_vocab_size)
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)
        self.validate_dspark()

    def validate_dspark(self) -> None:
        """Raise `ValueError` naming the fix for every invalid combination of settings."""
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size (γ) must be an integer >= 1, got {self.block_size!r}.")
        if self.num_hidden_layers < 1:
            raise ValueError(f"num_hidden_layers must be >= 1, got {self.num_hidden_layers}.")
        head = get_head(self.head_type)  # an unknown head type raises, listing the registered ones
        if self.hidden_act not in ACT2FN:
            raise ValueError(
                f"hidden_act {self.hidden_act!r} is not a transformers activation; use the target's (e.g. 'silu', "
                "'gelu_pytorch_tanh')."
            )
        if head.module is not None and (not isinstance(self.markov_rank, int) or self.markov_rank < 1):
            raise ValueError(
                f"markov_rank must be >= 1 with head_type={self.head_type!r}, got {self.markov_rank!r}; "
                "use head_type='none' for a drafter without a sequential head."
            )
        self._validate_taps()
        self._validate_calibration()
        self._validate_heldout_acceptance()
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of num_key_value_heads "
                f"({self.num_key_value_heads})."
            )
        if self.mask_token_id is not None and not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(
                f"mask_token_id {self.mask_token_id} is outside the vocabulary (0..{self.vocab_size - 1}); "
                "pick an unused special token or pass None to learn a mask embedding."
            )
        if self.draft_vocab_size is not None and not 1 <= self.draft_vocab_size < self.vocab_size:
            raise ValueError(
                f"draft_vocab_size must be between 1 and vocab_size ({self.vocab_size}), got "
                f"{self.draft_vocab_size}; pass None to draft over the full vocabulary."
            )
        if self.source_layout not in SOURCE_LAYOUTS:
            raise ValueError(f"source_layout must be one of {SOURCE_LAYOUTS}, got {self.source_layout!r}.")
        if not self.sample_from_anchor and self.source_layout == "native":
            raise ValueError(
                "sample_from_anchor=False (the DFlash anchor + γ masks layout) is not a native DSpark layout; "
                "load DFlash checkpoints through hf_dspark.interop, which keeps their convention."
            )

    def _validate_taps(self) -> None:
        """target_layer_ids: non-empty, distinct, inside the target, and never its last layer."""
        if not self.target_layer_ids:
            raise ValueError("target_layer_ids is empty; tap at least one target layer (e.g. [1]).")
        if len(set(self.target_layer_ids)) != len(self.target_layer_ids):
            raise ValueError(f"target_layer_ids has duplicates: {self.target_layer_ids}.")
        last = self.num_target_layers - 1
        for layer in self.target_layer_ids:
            if layer < EMBEDDING_TAP or layer > last:
                raise ValueError(
                    f"target_layer_ids contains {layer}, outside the target's layers 0..{last} (or -1, the "
                    "embedding output)."
                )
        if last in self.target_layer_ids:
            raise ValueError(
                f"target_layer_ids taps the target's last layer ({last}); its output is the next-token "
                f"representation the drafter must not copy. Use layers up to {last - 1} "
                f"(default: {default_target_layer_ids(self.num_target_layers)})."
            )

    def _validate_calibration(self) -> None:
        """One finite, positive STS temperature per position, for each mode that has them."""
        if len(self.calibration_temperatures) != self.block_size:
            raise ValueError(
                f"calibration_temperatures has {len(self.calibration_temperatures)} entries for block_size "
                f"{self.block_size}; give one temperature per position (or none for 1.0)."
            )
        temps = list(self.calibration_temperatures) + list(self.calibration_temperatures_greedy or [])
        if any(not math.isfinite(t) or t <= 0 for t in temps):
            raise ValueError(f"calibration temperatures must be finite and > 0, got {temps}.")
        if self.calibration_temperatures_greedy is not None and len(self.calibration_temperatures_greedy) != (
            self.block_size
        ):
            raise ValueError("calibration_temperatures_greedy needs one temperature per position (block_size).")

    def _validate_heldout_acceptance(self) -> None:
        for mode, rates in (self.heldout_acceptance or {}).items():
            if mode not in ("greedy", "sampling") or len(rates) != self.block_size:
                raise ValueError(
                    f"heldout_acceptance needs keys 'greedy' / 'sampling' with one rate per position "
                    f"(block_size {self.block_size}), got {mode!r} with {len(rates)} rates."
                )
            if any(not 0.0 <= q <= 1.0 for q in rates):
                raise ValueError(f"heldout_acceptance[{mode!r}] rates must lie in [0, 1], got {rates}.")

    def acceptance_prior(self, greedy: bool) -> list[float] | None:
        """The held-out conditional acceptance of this decoding mode (the other mode's when only it was measured),
        or None when the drafter was never calibrated."""
        table = self.heldout_acceptance or {}
        first, second = ("greedy", "sampling") if greedy else ("sampling", "greedy")
        return table.get(first) or table.get(second)

    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids)

    @property
    def num_draft_tokens(self) -> int:
        """Rows of the drafter's LM head and Markov `W2`: `draft_vocab_size`, or the full `vocab_size`."""
        return self.draft_vocab_size or self.vocab_size

    @property
    def num_block_slots(self) -> int:
        """Input slots of one block: γ (anchor-first) or γ + 1 (DFlash layout, `sample_from_anchor=False`)."""
        return self.block_size + (0 if self.sample_from_anchor else 1)

    @property
    def first_draft_slot(self) -> int:
        """Slot whose output drafts x_1: 0 (anchor-first) or 1 (DFlash layout)."""
        return 0 if self.sample_from_anchor else 1

    def temperatures_for(self, greedy: bool) -> list[float]:
        """STS temperatures for a decoding mode (greedy falls back to the sampling ones)."""
        if greedy and self.calibration_temperatures_greedy is not None:
            return list(self.calibration_temperatures_greedy)
        return list(self.calibration_temperatures)

    @classmethod
    def from_target(cls, target_config: PreTrainedConfig, **overrides: Any) -> DSparkConfig:
        """Build a drafter config whose layers copy the shape of a decoder-only HF target.

        Works for Llama, Qwen2/Qwen3, Mistral, Gemma families and any config exposing the usual fields.
        `overrides` set any `DSparkConfig` argument (e.g. `block_size=8, head_type="rnn"`).
        """
        text_config = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
        if getattr(text_config, "is_encoder_decoder", False):
            raise ValueError("DSpark drafts for decoder-only targets; this target is an encoder-decoder model.")
        model_type = getattr(text_config, "model_type", None)
        required = ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size", "intermediate_size")
        missing = [name for name in required if getattr(text_config, name, None) is None]
        if missing:
            raise ValueError(f"target config ({model_type}) lacks {missing}; is it a decoder-only language model?")
        hidden = text_config.hidden_size
        heads = text_config.num_attention_heads
        rope = getattr(text_config, "rope_parameters", None) or {}
        if not rope and getattr(text_config, "rope_theta", None) is not None:
            rope = {"rope_type": "default", "rope_theta": text_config.rope_theta}
        eps = getattr(text_config, "rms_norm_eps", None) or getattr(text_config, "layer_norm_eps", None) or 1e-6
        act = getattr(text_config, "hidden_act", None) or getattr(text_config, "hidden_activation", None) or "silu"
        fields: dict[str, Any] = {
            "num_target_layers": text_config.num_hidden_layers,
            "hidden_size": hidden,
            "num_attention_heads": heads,
            "num_key_value_heads": getattr(text_config, "num_key_value_heads", None) or heads,
            "head_dim": getattr(text_config, "head_dim", None) or hidden // heads,
            "intermediate_size": text_config.intermediate_size,
            "rms_norm_eps": eps,
            "hidden_act": act,
            "rope_parameters": dict(rope) if rope else None,
            "max_position_embeddings": getattr(text_config, "max_position_embeddings", 8192),
            "attention_bias": bool(getattr(text_config, "attention_bias", False)),
            "use_qk_norm": model_type in _QK_NORM_FAMILIES,
            "vocab_size": text_config.vocab_size,
            # transformers' Gemma embedding modules already apply their sqrt(d) scale, and the drafter calls the
            # target's module, so no extra multiplier is needed for any family shipped with transformers 5.
            "embedding_multiplier": 1.0,
            "target_model_type": model_type,
        }
        fields.update(overrides)
        if "target_layer_ids" not in overrides:
            fields["target_layer_ids"] = default_target_layer_ids(fields["num_target_layers"])
        return cls(**fields)
