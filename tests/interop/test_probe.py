"""`probe_layout` / `hf-dspark check-layout`: a drafter built so its first draft is right only when read
anchor-first is recognised as such, and a config declaring the other layout is reported mislabelled."""

import pytest
import torch

from hf_dspark.cli import main as cli_main
from hf_dspark.interop import export_drafter, probe_layout
from tests.helpers import char_tokenizer, make_drafter, make_target


def _copy_target(kind="llama"):
    """A target whose greedy next token is the current one: residual layers zeroed, LM head = the embedding with
    rows of equal norm (so e_i · e_i > e_j · e_i for j != i)."""
    target = make_target(kind)
    with torch.no_grad():
        for layer in target.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed = target.get_input_embeddings().weight
        rows = torch.randn(embed.shape, generator=torch.Generator().manual_seed(1))
        embed.copy_(rows / rows.norm(dim=-1, keepdim=True))
        target.get_output_embeddings().weight.copy_(embed)
    return target


def _copy_drafter(target, **overrides):
    """Zeroed layers too: slot k's output is its own input embedding, so slot 0 (the anchor) drafts the target's
    next token and slot 1 (a mask) always drafts the mask token."""
    fields = dict(head_type="none", use_confidence_head=False, mask_token_id=95) | overrides
    drafter = make_drafter(target, **fields)
    with torch.no_grad():
        for layer in drafter.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return drafter


@pytest.fixture(scope="module")
def target():
    return _copy_target()


def _held_out():
    return torch.randint(3, 90, (2, 20), generator=torch.Generator().manual_seed(0))


def test_probe_recognises_an_anchor_first_drafter(target):
    assert torch.equal(target(_held_out()).logits.argmax(-1), _held_out())  # the construction holds
    probe = probe_layout(_copy_drafter(target), target, _held_out())
    assert probe.positions == 38 and probe.anchor_first == 1.0 and probe.dflash < 0.1
    assert probe.measured == "anchor-first" and probe.matches is True and "config is right" in probe.summary()


def test_probe_reports_a_mislabelled_config(target):
    drafter = _copy_drafter(target, sample_from_anchor=False, source_layout="dflash")
    probe = probe_layout(drafter, target, _held_out(), max_positions=24)
    assert probe.positions == 24 and probe.declared == "dflash" and probe.measured == "anchor-first"
    assert (
        probe.matches is False
        and "MISLABELLED" in probe.summary()
        and "--assume-layout anchor-first" in (probe.summary())
    )
    assert drafter.config.sample_from_anchor is False  # the probe leaves the config as it was


def test_probe_without_a_verdict_on_a_random_drafter(target):
    probe = probe_layout(make_drafter(target, mask_token_id=95), target, _held_out()[:, :2])
    assert probe.positions == 2 and (probe.measured is None) == (abs(probe.anchor_first - probe.dflash) < 0.05)


def test_cli_check_layout_passes_a_right_config_and_fails_a_mislabelled_one(tmp_path, capsys):
    target = _copy_target("qwen3")
    target.save_pretrained(tmp_path / "target")
    char_tokenizer().save_pretrained(tmp_path / "target")
    _copy_drafter(target).save_pretrained(tmp_path / "right")
    args = ["check-layout", "--target", str(tmp_path / "target"), "--tokens", "30"]
    assert cli_main([*args, str(tmp_path / "right")]) == 0
    assert "anchor-first 1.000" in capsys.readouterr().out
    shifted = _copy_drafter(target, sample_from_anchor=False, source_layout="dflash")
    export_drafter(shifted, tmp_path / "shifted", engine="vllm", dtype=torch.float32)  # DFlashDraftModel, 1 + N
    assert cli_main([*args, str(tmp_path / "shifted")]) == 1
    out = capsys.readouterr().out
    assert "declares dflash" in out and "MISLABELLED" in out and "--assume-layout anchor-first" in out


def test_probe_measures_only_after_min_context(target):
    """Anchors before `min_context` are context only: a drafter that drafts well only with enough context (every
    real one) is then not diluted by the first few positions, where either reading drafts poorly."""
    drafter = _copy_drafter(target)
    probe = probe_layout(drafter, target, _held_out(), min_context=15)
    assert probe.positions == 2 * (20 - 15) and probe.measured == "anchor-first"
    with pytest.raises(ValueError, match="longer than min_context=20"):
        probe_layout(drafter, target, _held_out(), min_context=20)


def test_probe_reads_the_backbone_when_the_sequential_head_hides_the_layout(target):
    """A Markov head whose bias alone drafts the target's next token (here: the anchor again) makes the proposals
    right under both readings; the backbone's first draft still tells them apart, and the verdict follows it."""
    vocab = target.config.vocab_size
    drafter = _copy_drafter(target, head_type="markov", markov_rank=vocab)
    with torch.no_grad():
        drafter.markov_head.markov_w1.weight.copy_(torch.eye(vocab) * 30.0)
        drafter.markov_head.markov_w2.weight.copy_(torch.eye(vocab) * 30.0)
    probe = probe_layout(drafter, target, _held_out())
    assert probe.anchor_first == 1.0 and probe.dflash == 1.0  # the proposals alone cannot tell
    assert probe.backbone_anchor_first == 1.0 and probe.backbone_dflash < 0.1
    assert probe.measured == "anchor-first" and probe.matches is True and "backbone alone" in probe.summary()
