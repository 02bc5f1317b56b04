"""A wall-clock training budget: steps from the measured speed, an LR schedule that ends there, a hard stop."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from tiny_helpers import make_tiny_drafter, tokenized_records

from hf_dspark.training import time_budget
from hf_dspark.training.data import build_dataset
from hf_dspark.training.time_budget import BudgetedSchedule, TimeBudgetCallback, steps_within
from hf_dspark.training.trainer import DSparkTrainer, DSparkTrainingArguments


def test_budgeted_schedule_shapes():
    cosine = BudgetedSchedule("cosine", warmup=4, total=14)
    assert [cosine(s) for s in (0, 2, 4)] == [0.0, 0.5, 1.0]
    assert cosine(9) == pytest.approx(0.5) and cosine(14) == pytest.approx(0.0) and cosine(20) == pytest.approx(0.0)
    linear = BudgetedSchedule("linear", warmup=0, total=10)
    assert linear(5) == pytest.approx(0.5) and linear(10) == 0.0
    assert BudgetedSchedule("constant_with_warmup", warmup=2, total=3)(50) == 1.0


def test_steps_within():
    assert steps_within(10.0, 0.5, done=4, cap=100, safety=1.0) == 24
    assert steps_within(10.0, 0.5, done=4, cap=10, safety=1.0) == 10
    assert steps_within(-3.0, 0.5, done=4, cap=10, safety=0.9) == 4
    assert steps_within(10.0, 0.5, done=4, cap=100, safety=0.5) == 14


class _Clock:
    """One second passes per reading."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        self.now += 1.0
        return self.now


def _train(tmp_path, target, monkeypatch, callback, max_steps=100, warmup_steps=0):
    monkeypatch.setattr(time_budget, "time", SimpleNamespace(monotonic=_Clock().monotonic))
    args = DSparkTrainingArguments(
        output_dir=str(tmp_path),
        max_steps=max_steps,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        lr_scheduler_type="cosine",
        warmup_steps=warmup_steps,
        logging_steps=1,
        save_strategy="no",
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        anchors_per_sequence=2,
        seed=0,
        dataloader_num_workers=0,
    )
    trainer = DSparkTrainer(
        model=make_tiny_drafter(target),
        args=args,
        target=target,
        train_dataset=build_dataset(tokenized_records(8)),
        callbacks=[callback],
    )
    trainer.train()
    lrs = [entry["learning_rate"] for entry in trainer.state.log_history if "learning_rate" in entry]
    return trainer, lrs


def test_budget_plans_the_steps_and_the_schedule_ends_there(tmp_path, tiny_target, monkeypatch):
    callback = TimeBudgetCallback(20.0, skip=2, measure=3, safety=1.0)
    trainer, lrs = _train(tmp_path, tiny_target, monkeypatch, callback)
    # 1 s per step measured over steps 2..5; 15 s left at step 5 -> 15 more steps
    assert callback.summary["planned_steps"] == 20 and callback.summary["seconds_per_step"] == pytest.approx(1.0)
    assert trainer.state.global_step == 20 and callback.summary["stopped_by"] == "schedule"
    assert lrs[-1] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 19 / 20)))  # the 20-step cosine
    assert lrs[9] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 9 / 20)))


def test_agree_sets_the_steps_and_the_hard_stop_ends_a_slow_run(tmp_path, tiny_target, monkeypatch):
    agreed = TimeBudgetCallback(20.0, skip=2, measure=3, safety=1.0, agree=lambda own: own - 12)
    trainer, _ = _train(tmp_path / "a", tiny_target, monkeypatch, agreed)
    assert agreed.summary["own_estimate"] == 20 and trainer.state.global_step == 8
    late = TimeBudgetCallback(20.0, skip=2, measure=3, safety=1.0, agree=lambda own: 10**6)
    trainer, _ = _train(tmp_path / "b", tiny_target, monkeypatch, late, max_steps=60)
    assert late.summary["planned_steps"] == 60  # capped at max_steps
    assert late.summary["stopped_by"] == "time" and trainer.state.global_step == 20


def test_time_budget_argument_adds_the_callback_and_refuses_other_schedules(tmp_path, tiny_target):
    args = DSparkTrainingArguments(
        output_dir=str(tmp_path),
        max_steps=3,
        use_cpu=True,
        report_to="none",
        time_budget_minutes=1.0,
        lr_scheduler_type="polynomial",
    )
    trainer = DSparkTrainer(
        model=make_tiny_drafter(tiny_target),
        args=args,
        target=tiny_target,
        train_dataset=build_dataset(tokenized_records(4)),
    )
    assert any(isinstance(c, TimeBudgetCallback) for c in trainer.callback_handler.callbacks)
    with pytest.raises(ValueError, match="lr_scheduler_type"):
        trainer.train()
    with pytest.raises(ValueError, match="time_budget_minutes"):
        DSparkTrainingArguments(output_dir=str(tmp_path), time_budget_minutes=0)
