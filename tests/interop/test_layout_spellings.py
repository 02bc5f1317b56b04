"""Imports read the block layout from every spelling, top level or nested in dflash_config (SpecForge's nested
DSpark format, query_zero_predicts_next, dspark_bonus_anchor, shift_label), and refuse conflicting or missing
layout information unless assume_layout says which."""

import json

import pytest

from hf_dspark import DSparkDrafter
from tests.helpers import make_target
from tests.interop.reference import deepspec_folder, dflash_folder


@pytest.fixture(scope="module")
def qwen3_target():
    return make_target("qwen3")


def _edit(folder, change):
    raw = json.loads((folder / "config.json").read_text())
    change(raw)
    (folder / "config.json").write_text(json.dumps(raw))
    return folder


def _specforge(folder, target, **nested_extra):
    """SpecForge DSpark: DSparkDraftModel, every DSpark field nested in dflash_config, no layout flag (1 + N)."""
    folder = deepspec_folder(folder, target, block_size=5)

    def nest(raw):
        keys = (
            "block_size",
            "mask_token_id",
            "target_layer_ids",
            "markov_rank",
            "markov_head_type",
            "enable_confidence_head",
            "confidence_head_with_markov",
            "num_anchors",
        )
        raw["dflash_config"] = {k: raw.pop(k) for k in keys} | {"projector_type": "dspark"} | nested_extra
        raw.pop("sample_from_anchor")
        raw["architectures"] = ["DSparkDraftModel"]

    return _edit(folder, nest)


def test_specforge_nested_format_reads_as_anchor_plus_masks(tmp_path, qwen3_target):
    drafter = DSparkDrafter.from_pretrained(_specforge(tmp_path / "sf", qwen3_target), target=qwen3_target)
    assert (drafter.config.sample_from_anchor, drafter.config.block_size) == (False, 4)
    assert drafter.config.head_type == "markov" and drafter.config.mask_token_id == 95


def test_specforge_nested_flag_wins_over_the_format_default(tmp_path, qwen3_target):
    folder = _specforge(tmp_path / "sf", qwen3_target, query_zero_predicts_next=True)
    drafter = DSparkDrafter.from_pretrained(folder, target=qwen3_target)
    assert (drafter.config.sample_from_anchor, drafter.config.block_size) == (True, 5)


@pytest.mark.parametrize(
    ("where", "key", "value", "anchor_first"),
    [
        ("dflash_config", "query_zero_predicts_next", True, True),
        ("dflash_config", "query_zero_predicts_next", False, False),
        ("top", "dspark_bonus_anchor", True, False),
        ("top", "dspark_bonus_anchor", False, True),
        ("dflash_config", "shift_label", True, True),
        ("top", "sample_from_anchor", True, True),
    ],
)
def test_dflash_folders_read_every_spelling(tmp_path, qwen3_target, where, key, value, anchor_first):
    def flag(raw):
        (raw["dflash_config"] if where == "dflash_config" else raw)[key] = value

    folder = _edit(dflash_folder(tmp_path / "d", qwen3_target, block_size=5), flag)
    drafter = DSparkDrafter.from_pretrained(folder, target=qwen3_target)
    assert drafter.config.sample_from_anchor is anchor_first
    assert drafter.config.block_size == (5 if anchor_first else 4)


def test_conflicting_spellings_are_refused_unless_assume_layout(tmp_path, qwen3_target):
    def conflict(raw):
        raw["sample_from_anchor"] = True
        raw["dflash_config"]["query_zero_predicts_next"] = False

    folder = _edit(dflash_folder(tmp_path / "d", qwen3_target, block_size=5), conflict)
    with pytest.raises(ValueError, match=r"conflicting block layouts.*assume_layout.*--assume-layout"):
        DSparkDrafter.from_pretrained(folder, target=qwen3_target)
    drafter = DSparkDrafter.from_pretrained(folder, target=qwen3_target, assume_layout="dflash")
    assert (drafter.config.sample_from_anchor, drafter.config.block_size) == (False, 4)
    with pytest.raises(ValueError, match="assume_layout must be one of"):
        DSparkDrafter.from_pretrained(folder, target=qwen3_target, assume_layout="shifted")


def test_a_dspark_folder_of_unknown_origin_without_a_flag_is_refused(tmp_path, qwen3_target):
    def unknown(raw):
        raw.pop("sample_from_anchor")
        raw["dflash_config"] = {"target_layer_ids": raw["target_layer_ids"]}  # nested, yet not SpecForge

    folder = _edit(deepspec_folder(tmp_path / "u", qwen3_target), unknown)
    with pytest.raises(ValueError, match="records no block layout"):
        DSparkDrafter.from_pretrained(folder, target=qwen3_target)
    drafter = DSparkDrafter.from_pretrained(folder, target=qwen3_target, assume_layout="anchor-first")
    assert drafter.config.sample_from_anchor is True
