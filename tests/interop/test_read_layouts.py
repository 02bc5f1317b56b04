"""Reading z-lab DFlash and DeepSpec / serving-engine folders: the loaded drafter proposes what an independent
re-implementation of the layout's block forward computes (tests/interop/reference.py)."""

import json
import logging

import pytest
import torch

from hf_dspark import DSparkDrafter
from hf_dspark.interop import detect_layout
from tests.helpers import make_target, tapped_features
from tests.interop.reference import (
    deepspec_folder,
    dflash_folder,
    read_weights,
    reference_block,
    reference_greedy_drafts,
)


@pytest.fixture(scope="module")
def qwen3_target():
    return make_target("qwen3")


def _prompts(target, lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(3, 90, (len(lengths), width), generator=gen)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for r, n in enumerate(lengths):
        mask[r, width - n :] = 1
    return ids, mask


def _propose(drafter, target, ids, mask, do_sample=False):
    feats = tapped_features(target, ids, drafter.config.target_layer_ids, attention_mask=mask)
    cache = drafter.init_cache(ids.shape[0], capacity=4)
    drafter.extend_context(cache, feats[:, :-1], mask[:, :-1].bool())
    return drafter.propose(ids[:, -1], cache, return_probs=True, do_sample=do_sample), feats


def _check_rows(proposal, folder, target, ids, mask, feats, first_slot):
    raw = json.loads((folder / "config.json").read_text())
    weights = read_weights(folder)
    mask_id = raw.get("mask_token_id", (raw.get("dflash_config") or {}).get("mask_token_id"))
    embed, lm_head = target.get_input_embeddings().weight.detach(), target.get_output_embeddings().weight.detach()
    gamma = proposal.draft_ids.shape[1]
    for r in range(ids.shape[0]):
        n = int(mask[r].sum())
        context = feats[r, -n:-1]
        drafts, probs, conf = reference_greedy_drafts(
            weights, raw, context, int(ids[r, -1]), mask_id, gamma, first_slot, embed, lm_head
        )
        assert torch.equal(proposal.draft_ids[r], drafts), r
        torch.testing.assert_close(proposal.draft_probs[r], probs, rtol=1e-4, atol=1e-6)
        if conf is not None:
            yield r, conf


def test_dflash_folder_proposes_like_the_reference_with_the_dflash_block_convention(tmp_path, qwen3_target):
    folder = dflash_folder(tmp_path / "dflash", qwen3_target, block_size=5)
    assert detect_layout(folder) == "dflash"
    drafter = DSparkDrafter.from_pretrained(folder, target=qwen3_target)
    config = drafter.config
    assert (config.block_size, config.num_block_slots, config.sample_from_anchor) == (4, 5, False)
    assert config.source_layout == "dflash" and config.head_type == "none" and drafter.confidence_head is None
    assert config.mask_token_id == 95 and config.target_layer_ids == [0, 2]
    ids, mask = _prompts(qwen3_target, [9, 5, 7])
    proposal, feats = _propose(drafter, qwen3_target, ids, mask)
    assert proposal.draft_ids.shape == (3, 4)
    list(_check_rows(proposal, folder, qwen3_target, ids, mask, feats, first_slot=1))


def test_dflash_convention_differs_from_reading_the_same_weights_anchor_first(tmp_path, qwen3_target):
    """The convention matters: slot k predicts position anchor + k, not anchor + k + 1."""
    folder = dflash_folder(tmp_path / "dflash", qwen3_target, block_size=5)
    drafter = DSparkDrafter.from_pretrained(folder, target=qwen3_target)
    ids, mask = _prompts(qwen3_target, [8])
    proposal, feats = _propose(drafter, qwen3_target, ids, mask)
    raw, weights = json.loads((folder / "config.json").read_text()), read_weights(folder)
    embed = qwen3_target.get_input_embeddings().weight.detach()
    lm_head = qwen3_target.get_output_embeddings().weight.detach()
    wrong = reference_block(weights, raw, feats[0, :-1], torch.tensor([int(ids[0, -1])] + [95] * 3), embed)
    assert not torch.allclose(proposal.draft_probs[0], (wrong @ lm_head.T).softmax(-1), atol=1e-3)


def test_dflash_teacher_forced_forward_matches_the_reference(tmp_path, qwen3_target):
    folder = dflash_folder(tmp_path / "dflash", qwen3_target, block_size=4)
    drafter = DSparkDrafter.from_pretrained(folder, target=qwen3_target)
    ids, _ = _prompts(qwen3_target, [12])
    feats = tapped_features(qwen3_target, ids, drafter.config.target_layer_ids)
    anchor = 6
    out = drafter(feats, ids, anchor_positions=torch.tensor([[anchor]]))
    raw, weights = json.loads((folder / "config.json").read_text()), read_weights(folder)
    block = torch.tensor([int(ids[0, anchor])] + [95] * 3)
    hidden = reference_block(weights, raw, feats[0, :anchor], block, qwen3_target.get_input_embeddings().weight)
    expected = hidden[1:] @ qwen3_target.get_output_embeddings().weight.T
    torch.testing.assert_close(out.logits[0, 0], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("sample_from_anchor", [True, False])
def test_deepspec_folder_proposes_like_the_reference(tmp_path, qwen3_target, sample_from_anchor):
    folder = deepspec_folder(tmp_path / "ds", qwen3_target, block_size=4, sample_from_anchor=sample_from_anchor)
    temps = [1.5, 2.0, 0.5, 1.0] if sample_from_anchor else [1.5, 2.0, 0.5]
    (folder / "calibration.json").write_text(json.dumps({"sampling": temps, "greedy": [3.0] * len(temps)}))
    assert detect_layout(folder) == "deepspec"
    drafter = DSparkDrafter.from_pretrained(folder, target=qwen3_target)
    config = drafter.config
    gamma = 4 if sample_from_anchor else 3
    assert (config.block_size, config.sample_from_anchor, config.head_type) == (gamma, sample_from_anchor, "markov")
    assert config.calibration_temperatures == temps and config.calibration_temperatures_greedy == [3.0] * gamma
    assert config.heldout_acceptance is None  # a sidecar without measured acceptance
    assert config.use_qk_norm and config.confidence_with_markov and config.source_layout == "deepspec"
    ids, mask = _prompts(qwen3_target, [10, 6])
    proposal, feats = _propose(drafter, qwen3_target, ids, mask)
    first = 0 if sample_from_anchor else 1
    for r, conf_logits in _check_rows(proposal, folder, qwen3_target, ids, mask, feats, first_slot=first):
        expected = torch.sigmoid(conf_logits / 3.0)  # greedy proposals use the greedy STS temperatures
        torch.testing.assert_close(proposal.confidence[r], expected, rtol=1e-4, atol=1e-6)


def test_deepspec_shared_weights_are_checked_but_not_kept(tmp_path, qwen3_target):
    folder = deepspec_folder(tmp_path / "ds", qwen3_target)
    drafter = DSparkDrafter.from_pretrained(folder, target=qwen3_target)
    names = set(drafter.state_dict())
    assert "fc.weight" in names and not any("embed_tokens" in n or "lm_head" in n for n in names)
    assert drafter.bound_to(qwen3_target)


def test_deepspec_without_a_layout_field_is_anchor_first_without_a_warning(tmp_path, qwen3_target, caplog):
    """DeepSpec writes no layout field and is anchor-first only: a genuine checkpoint loads quietly."""
    folder = deepspec_folder(tmp_path / "ds", qwen3_target)
    raw = json.loads((folder / "config.json").read_text())
    del raw["sample_from_anchor"]
    (folder / "config.json").write_text(json.dumps(raw))
    with caplog.at_level(logging.WARNING):
        drafter = DSparkDrafter.from_pretrained(folder, target=qwen3_target)
    assert drafter.config.sample_from_anchor is True
    assert "sample_from_anchor" not in caplog.text and "assum" not in caplog.text


def test_foreign_folders_load_unbound_without_a_target(tmp_path, qwen3_target):
    drafter = DSparkDrafter.from_pretrained(dflash_folder(tmp_path / "d", qwen3_target))
    assert not drafter.is_bound and drafter.fc.weight.dtype == torch.float32
    drafter = DSparkDrafter.from_pretrained(deepspec_folder(tmp_path / "s", qwen3_target), dtype=torch.bfloat16)
    assert drafter.fc.weight.dtype == torch.bfloat16


def test_read_calibration_takes_the_acceptance_from_either_form_and_checks_it(tmp_path):
    from hf_dspark.interop.layouts import read_calibration

    sidecar = tmp_path / "calibration.json"
    sidecar.write_text(json.dumps({"reports": {"greedy": {"temperatures": [1.0, 1.0], "acceptance": [0.4, 0.5]}}}))
    assert read_calibration(tmp_path, 2)["heldout_acceptance"] == {"greedy": [0.4, 0.5]}
    sidecar.write_text(
        json.dumps(
            {
                "sampling": [1.0, 1.0],
                "acceptance": {"sampling": [0.3, 0.2]},
                "reports": {"sampling": {"acceptance": [0.9, 0.9]}},
            }
        )
    )
    assert read_calibration(tmp_path, 2)["heldout_acceptance"] == {"sampling": [0.3, 0.2]}  # the exported form wins
    sidecar.write_text(json.dumps({"sampling": [1.0, 1.0], "acceptance": {"sampling": [0.3]}}))
    with pytest.raises(ValueError, match=r"calibration.json: the 'sampling' acceptance needs 2 rates"):
        read_calibration(tmp_path, 2)
    sidecar.write_text(json.dumps({"sampling": [1.0, 1.0], "acceptance": [0.3, 0.2]}))
    with pytest.raises(ValueError, match="must map a decoding mode to rates"):
        read_calibration(tmp_path, 2)


def test_a_deepspec_tap_of_minus_one_reads_the_embedding_output(tmp_path, qwen3_target):
    """DeepSpec's tap −1 is the embedding output (hidden_states[0]): such a checkpoint loads, the loop's prefill
    captures hidden_states[0] for it, and the drafter proposes what the reference computes from those features."""
    from hf_dspark.generation.drafting import feature_layers
    from hf_dspark.generation.prefill import prefill_target

    folder = deepspec_folder(tmp_path / "ds", qwen3_target, taps=(-1, 2))
    drafter = DSparkDrafter.from_pretrained(folder, target=qwen3_target)
    assert drafter.config.target_layer_ids == [-1, 2]
    ids, mask = _prompts(qwen3_target, [10, 6])
    with torch.no_grad():
        hidden = qwen3_target(ids, attention_mask=mask, output_hidden_states=True).hidden_states
        captured = prefill_target(qwen3_target, ids, mask, None, None, feature_layers(drafter)).features
    feats = torch.cat([hidden[0], hidden[3]], dim=-1)  # DeepSpec: tap t reads hidden_states[t + 1]
    torch.testing.assert_close(captured, feats, rtol=0, atol=1e-6)
    cache = drafter.init_cache(ids.shape[0], capacity=4)
    drafter.extend_context(cache, captured[:, :-1], mask[:, :-1].bool())
    proposal = drafter.propose(ids[:, -1], cache, return_probs=True)
    assert len(list(_check_rows(proposal, folder, qwen3_target, ids, mask, feats, first_slot=0))) == 2
