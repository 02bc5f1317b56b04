"""`PolicyMemory`: the cross-call memory of the `"auto"` policy, owned by its caller (never a module global)."""

from __future__ import annotations

from .acceptance import AcceptanceMemory


class PolicyMemory:
    """Pooled acceptance and probe schedule of one drafter, one `AcceptanceMemory` per decoding mode (greedy and
    sampled drafts are accepted at different rates). Pass it as `dspark_policy_memory=` to several `generate`
    calls (or keep the engine's) to let `"auto"` learn across them; `reset()` forgets everything."""

    def __init__(self) -> None:
        self._modes: dict[bool, AcceptanceMemory] = {}

    def for_mode(self, block_size: int, greedy: bool) -> AcceptanceMemory:
        """The memory of this mode and γ (a fresh one for an unseen mode or another γ)."""
        memory = self._modes.get(bool(greedy))
        if memory is None or memory.trials.numel() != block_size:
            memory = self._modes[bool(greedy)] = AcceptanceMemory.empty(block_size)
        return memory

    def reset(self) -> None:
        """Forget every mode's pooled acceptance, cost corrections and probe schedule."""
        self._modes.clear()
