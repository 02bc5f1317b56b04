"""The resumable work file of `hf-dspark eval`: one JSON line per (drafter, ℓ, set, prompt, turn) record.

A record is reused on resume only when it was written with the same settings (`EvalConfig.fingerprint`) and by the
same drafter (`drafter_identity`: a digest of its class, config and weights), so a drafter retrained under the same
name is evaluated afresh. The records of one generate call are reused only when all of them were written: a call
interrupted between its records is played again whole, with its own rows and seed.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from torch import nn
from transformers.utils import logging

logger = logging.get_logger(__name__)


# Config fields that do not change a record: STS temperatures (records keep the raw confidence logits; the report
# applies the drafter's current temperatures), the held-out acceptance the "auto" policy starts from, bookkeeping.
IDENTITY_IGNORED = ("calibration_temperatures", "calibration_temperatures_greedy", "heldout_acceptance",
                    "transformers_version")


def drafter_identity(drafter: nn.Module) -> str:
    """A digest of the drafter's class, config and every tensor: a retrained drafter under the same name differs
    (a recalibrated one does not: see `IDENTITY_IGNORED`)."""
    digest = hashlib.blake2b(digest_size=12)
    config = drafter.config.to_dict()
    config = {k: v for k, v in config.items() if not k.startswith("_") and k not in IDENTITY_IGNORED}
    digest.update(type(drafter).__qualname__.encode())
    digest.update(json.dumps(config, sort_keys=True, default=str).encode())
    state = drafter.state_dict() if hasattr(drafter, "state_dict") else {}  # model-free proposers: none
    for name, tensor in sorted(state.items()):
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def target_identity(target: nn.Module) -> str:
    """A digest of the target's name, config, dtype and input embedding (cheap: not every weight), so records
    made against another target or dtype under the same `--out` are not reused."""
    digest = hashlib.blake2b(digest_size=12)
    config = {k: v for k, v in target.config.to_dict().items() if k != "transformers_version"}
    digest.update(json.dumps(config, sort_keys=True, default=str).encode())
    embedding = target.get_input_embeddings().weight.detach()
    digest.update(f"{getattr(target, 'name_or_path', '')}|{embedding.dtype}".encode())
    digest.update(embedding.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class WorkFile:
    """Append-only JSONL of per-(drafter, ℓ, set, prompt, turn) records; records of other settings are ignored, and
    so are records of a drafter whose identity (`identities[name]`, see `drafter_identity`) has changed. Records
    written before identities were recorded (no `drafter_id`) are reused with a warning."""

    def __init__(self, path: Path, fingerprint: str, resume: bool = True,
                 identities: dict[str, str] | None = None) -> None:
        self.path, self.fingerprint = Path(path), fingerprint
        self.identities = dict(identities or {})
        self.records: dict[tuple, dict] = {}
        if resume and self.path.is_file():
            self._load()
        elif self.path.exists():
            self.path.unlink()

    def _load(self) -> None:
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):  # drop a line cut by an interruption before appending again
            with open(self.path, "r+b") as handle:
                handle.truncate(data.rfind(b"\n") + 1)
        ignored, changed, legacy, current = 0, {}, set(), set()
        with open(self.path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    logger.warning(f"{self.path}: skipped a malformed line")
                    continue
                if record.get("fingerprint") != self.fingerprint:
                    ignored += 1
                    continue
                expected = self.identities.get(record.get("drafter"))
                if expected is not None and "drafter_id" not in record:
                    legacy.add(record["drafter"])  # written before identities were recorded: reused, with a warning
                elif expected is not None and record["drafter_id"] != expected:
                    changed[record["drafter"]] = changed.get(record["drafter"], 0) + 1
                    continue
                elif expected is not None:
                    current.add(record["drafter"])
                self.records[self.key(record)] = record
        dropped = self._drop_incomplete_calls()
        if dropped:
            logger.warning(f"{self.path}: {dropped} record(s) of a generate call interrupted before all its records "
                           "were written are played again with that call's rows and seed")
        if ignored:
            logger.warning(f"{self.path}: ignored {ignored} record(s) of other settings than {self.fingerprint}")
        for name, count in sorted(changed.items()):
            reused = ("its records of these weights are reused" if name in current
                      else "evaluating it afresh")
            logger.warning(f"{self.path}: drafter {name!r} changed since {count} of its records were written (other "
                           f"weights or config under the same name); those are ignored, {reused}")
        if legacy:
            logger.warning(f"{self.path}: the records of {sorted(legacy)} predate drafter identities and are reused "
                           "as if written by the drafters given now; pass --restart if any of them has changed since")

    def _drop_incomplete_calls(self) -> int:
        """Forget the records of a generate call whose rows (`record["call"]`: the prompt indices it played) were
        not all written, so that the call is played again whole, with its own rows and seed, as an uninterrupted
        run plays it (a batch's other rows and its seed change every sampled reply). Returns how many."""
        incomplete = [key for key, record in self.records.items() if "call" in record and any(
            self.key({**record, "prompt": prompt}) not in self.records for prompt in record["call"])]
        for key in incomplete:
            del self.records[key]
        return len(incomplete)

    @staticmethod
    def key(record: dict) -> tuple:
        return record["drafter"], record["verify_len"], record["set"], record["prompt"], record["turn"]

    def get(self, *key) -> dict | None:
        return self.records.get(tuple(key))

    def append(self, record: dict) -> None:
        record = {"fingerprint": self.fingerprint, **record}
        if record["drafter"] in self.identities:
            record["drafter_id"] = self.identities[record["drafter"]]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.records[self.key(record)] = record
