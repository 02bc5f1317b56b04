"""Hand committed tokens to a `generate` streamer in the shape plain `generate` uses.

Plain `generate` puts the prompt (done by `generate` itself before the decoding loop), then one `[B]` tensor per
decoding step: every row's new token, the pad token for rows that already finished. DSpark rows advance by
different numbers of tokens per round, so at batch > 1 a step is handed over once every unfinished row has
reached it; at batch 1 each round's committed tokens go out at once (as transformers' assisted loop does).
"""

from __future__ import annotations

import torch


class CommitStreamer:
    """Streams the generated part of `rows` (a `RowState`) to `streamer` as it is committed.

    Args:
        streamer: a transformers `BaseStreamer` (or None: every call is a no-op).
        rows: the call's `RowState` (histories, `lengths`, `prompt_width`, `finished`, `pad_token_id`).
    """

    def __init__(self, streamer, rows) -> None:
        self.streamer = streamer
        self.rows = rows
        self.sent = 0  # generated steps already handed over

    def _generated(self, row: int) -> int:
        return self.rows.lengths[row] - self.rows.prompt_width

    def _put_steps(self, ready: int) -> None:
        width = self.rows.prompt_width
        histories = self.rows.histories if ready > self.sent else []
        for step in range(self.sent, ready):
            tokens = [
                int(history[width + step]) if width + step < history.shape[0] else self.rows.pad_token_id
                for history in histories
            ]
            self.streamer.put(torch.tensor(tokens))
        self.sent = max(self.sent, ready)

    def flush(self) -> None:
        """Hand over what every row has committed so far (call after each commit round)."""
        if self.streamer is None:
            return
        rows = range(len(self.rows.lengths))
        if len(rows) == 1:
            new = self.rows.history(0)[self.rows.prompt_width + self.sent :]
            if new.numel():
                self.streamer.put(new.cpu())
            self.sent += int(new.numel())
            return
        pending = [self._generated(r) for r in rows if not self.rows.finished[r]]
        self._put_steps(min(pending) if pending else max(self._generated(r) for r in rows))

    def end(self) -> None:
        """Hand over the rest and close the stream."""
        if self.streamer is None:
            return
        if len(self.rows.lengths) > 1:
            self._put_steps(max(self._generated(r) for r in range(len(self.rows.lengths))))
        else:
            self.flush()
        self.streamer.end()
