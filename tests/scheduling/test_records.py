"""Pending schedule records: τ̂ / Θ̂ computed when read, many rounds at once, equal to the per-round formula."""

import pytest
import torch

from hf_dspark.ops.functional import prefix_survival
from hf_dspark.profiling.step_curve import StepCurve
from hf_dspark.scheduling.expectation import expected_throughput, expected_tokens, expected_tokens_per_round
from hf_dspark.scheduling.records import ScheduleRecord, resolve_schedules


def _rounds(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    rounds = []
    for rows in (3, 1, 5, 2):
        confidence = torch.rand(rows, 4, generator=gen)
        lengths = torch.randint(0, 5, (rows,), generator=gen).tolist()
        rounds.append((confidence, lengths))
    return rounds


def test_per_round_batch_matches_the_formula():
    rounds = _rounds()
    confidence = torch.cat([c for c, _ in rounds])
    lengths = [n for _, ls in rounds for n in ls]
    got = expected_tokens_per_round(confidence, lengths, [len(ls) for _, ls in rounds])
    want = [float(expected_tokens(prefix_survival(c), torch.tensor(ls))) for c, ls in rounds]
    assert got == pytest.approx(want, rel=1e-12)
    assert expected_tokens_per_round(confidence[:0], [], []) == []


def test_pending_records_resolve_on_read_and_together():
    curve = StepCurve([1, 8, 64], [100.0, 90.0, 40.0], model="t")
    rounds = _rounds(1)
    records = [ScheduleRecord.pending(c, ls, curve) for c, ls in rounds]
    assert all(r.is_pending for r in records)
    first = records[0].expected_tokens  # one read resolves that record alone
    assert not records[0].is_pending and records[1].is_pending
    resolve_schedules(records)
    assert not any(r.is_pending for r in records)
    for record, (c, ls) in zip(records, rounds):
        lengths = torch.tensor(ls)
        assert record.expected_tokens == pytest.approx(float(expected_tokens(prefix_survival(c), lengths)))
        assert record.expected_throughput == pytest.approx(
            float(expected_throughput(prefix_survival(c), lengths, curve)), rel=1e-9
        )
    assert first == records[0].expected_tokens
    assert ScheduleRecord().expected_tokens is None and ScheduleRecord(3.0, None) == ScheduleRecord(3.0)
