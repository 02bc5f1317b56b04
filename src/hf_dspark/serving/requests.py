"""`DSparkEngine`'s request records: one request's state (`EngineRequest`), one round's numbers (`EngineRoundRecord`)
and the bounded store of finished requests nobody has collected yet (`FinishedRequests`)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch
from transformers.utils import logging

logger = logging.get_logger(__name__)

DEFAULT_MAX_FINISHED = 1024  # finished requests kept until `result` / `take_finished` collects them


@dataclass
class EngineRequest:
    """One request's state and timings (seconds from `time.perf_counter`).

    `error` is the exception that ended a failed request (its traceback dropped, so it holds no frames or tensors)
    and `error_message` says where it was raised (`"prefill"` or `"round"`) and what it was; both are None for a
    request that finished normally or was cancelled. `failures` counts its failed attempts in a row (a request is
    retried once, alone, before it fails)."""

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
    error_message: str | None = None
    failures: int = 0

    @property
    def history(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.prompt_ids.new_tensor(self.generated)])


@dataclass
class EngineRoundRecord:
    """running: rows in the round; verify_lens / committed: per row; drafted: rows that ran the drafter;
    seconds: the whole `step` (admission included); policy_seconds: the policy's decisions; nodes_verified: a tree
    round's drafts verified per row (`RoundRecord.nodes_verified`), None for chains."""

    running: int
    verify_lens: list[int]
    committed: list[int]
    seconds: float
    drafted: int = 0
    policy_seconds: float = 0.0
    nodes_verified: list[int] | None = None


class FinishedRequests:
    """Finished requests that left the running batch and were not collected yet, oldest first.

    Args:
        limit: at most this many are kept; adding one more drops the oldest (with a warning, once per engine).
            None keeps every one (memory grows with every request a caller never collects).
    """

    def __init__(self, limit: int | None = DEFAULT_MAX_FINISHED) -> None:
        if limit is not None and (type(limit) is not int or limit < 0):
            raise ValueError(f"max_finished must be None (keep every finished request) or an int >= 0, got {limit!r}.")
        self.limit = limit
        self.dropped = 0
        self._items: OrderedDict[int, EngineRequest] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._items

    def get(self, request_id: int) -> EngineRequest | None:
        return self._items.get(request_id)

    def add(self, request: EngineRequest) -> None:
        """Keep `request`; drop the oldest beyond `limit`."""
        self._items[request.request_id] = request
        while self.limit is not None and len(self._items) > self.limit:
            oldest, _ = self._items.popitem(last=False)
            if not self.dropped:
                logger.warning(
                    f"DSparkEngine dropped finished request {oldest}, which was never collected: it keeps at most "
                    f"max_finished={self.limit} finished requests. Collect them with result(request_id) or "
                    "take_finished(), or build the engine with a larger max_finished."
                )
            self.dropped += 1

    def pop(self, request_id: int) -> EngineRequest | None:
        return self._items.pop(request_id, None)

    def take_all(self) -> list[EngineRequest]:
        """Every kept request, in id order; the store is emptied."""
        taken = sorted(self._items.values(), key=lambda request: request.request_id)
        self._items.clear()
        return taken


__all__ = ["DEFAULT_MAX_FINISHED", "EngineRequest", "EngineRoundRecord", "FinishedRequests"]
