"""`DSparkEngine`'s fault handling: a prefill or round that raises is undone and its requests retried once, each
alone; a request that fails alone finishes with the error, the others rejoin the batch (serving/engine.py).

`EngineFaults` is the engine's mixin for this; it reads and writes the engine's own request table, batch and locks.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from transformers.utils import logging

from ..scheduling.verification_policy import VerificationPolicy

if TYPE_CHECKING:
    from ..generation.round import RoundBatch
    from .requests import EngineRequest

logger = logging.get_logger(__name__)

Events = list[tuple[int, list[int]]]  # (request id, tokens it gained) per request


class EngineFaults:
    """Undo, isolate and record faults of `DSparkEngine` steps (see the module docstring)."""

    def _guarded_round(self, start: float) -> Events:
        """`_round` on the running batch; if it raises, the round is undone and its requests retried alone."""
        batch = self.batch
        before = {rid: len(self.requests[rid].generated) for rid in batch.rows}
        try:
            events = self._round(batch, start)
        except Exception as error:
            rows = self._roll_back(batch, before)
            self._log_fault("round", rows, error)
            return self._retry_alone(rows, "round")
        for rid in batch.rows:
            self.requests[rid].failures = 0
        return events

    def _roll_back(self, batch: RoundBatch, before: dict[int, int]) -> list[int]:
        """Drop the batch (its caches are in an unknown state); every request gets back the tokens it had before
        the round. Returns the requests to retry (the cancelled ones leave)."""
        with self._queue_lock:  # take_finished must not see the batch gone before its requests are rolled back
            self.batch = None
            if isinstance(self.policy, VerificationPolicy):
                self.policy.forget(list(batch.rows))
            for rid, length in before.items():
                request = self.requests[rid]
                del request.generated[length:]
                if not request.cancelled:
                    request.finished, request.finished_at = False, None
            retry = [rid for rid in before if not self.requests[rid].cancelled]
            self._retire(list(before))  # the cancelled ones
        return retry

    def _retry_alone(self, rids: list[int], stage: str) -> Events:
        """Each request of a failed forward alone: prefill (its prompt and kept tokens), then for a failed round
        one round; a request that raises again finishes with the error, the others join the running batch."""
        events: Events = []
        for rid in rids:
            request = self.requests.get(rid)
            if request is None or request.finished:  # cancelled meanwhile
                continue
            request.failures += 1  # the failed forward
            before, failing = len(request.generated), "prefill"
            try:
                batch, tokens = self._prefill([rid])
                gained = self._commit_first(batch, tokens)
                if stage == "round" and not request.finished:
                    failing = "round"
                    gained += self._round(batch, time.perf_counter())
                    if self.drafter is not None:
                        batch.flush(self.drafter)  # a batch joins another with no queued updates
            except Exception as error:
                del request.generated[before:]
                request.failures += 1
                if isinstance(self.policy, VerificationPolicy):
                    self.policy.forget([rid])  # what its solo round may have recorded
                self._fail(request, failing, error)
                continue
            request.failures = 0
            events += gained
            if not request.finished:
                self._join(batch)
        self._retire(rids)
        return events

    def _fail(self, request: EngineRequest, stage: str, error: Exception) -> None:
        logger.warning(
            f"DSparkEngine request {request.request_id} failed again, alone, in its {stage} ({type(error).__name__}: "
            f"{error}); it finishes with the error, the other requests go on.",
            exc_info=error,
        )
        with self._queue_lock:
            request.error = error.with_traceback(None)  # keeps no frames (and their tensors) alive
            request.error_message = f"{stage} raised {type(error).__name__}: {error}"
            request.finished, request.finished_at = True, time.perf_counter()

    @staticmethod
    def _log_fault(stage: str, rids: list[int], error: Exception) -> None:
        logger.warning(
            f"DSparkEngine: a {stage} of requests {rids[:8]}{' ...' if len(rids) > 8 else ''} raised "
            f"{type(error).__name__}: {error}; each is retried once, alone."
        )

    def _retire(self, rids: list[int]) -> None:
        """Move the finished requests among `rids` (none of them in the batch) to `finished`; the ones `result`
        already returned are released."""
        with self._queue_lock:
            for rid in rids:
                request = self.requests.get(rid)
                if request is None or not request.finished:
                    continue
                del self.requests[rid]
                if rid in self._released:
                    self._released.discard(rid)
                else:
                    self.finished.add(request)


__all__ = ["EngineFaults", "Events"]
