import pytest
import torch
from transformers import AutoModel

from hf_dspark import DSparkConfig, DSparkDrafter
from tests.helpers import make_drafter, make_target, tapped_features


def _context(target, drafter, lengths, seed=0):
    """Random prompts of the given lengths (left-padded), their tapped features, and a drafter cache holding the
    context of every token but the last (the anchor), as the generation loop keeps it."""
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(3, target.config.vocab_size, (len(lengths), width), generator=gen)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for r, n in enumerate(lengths):
        mask[r, width - n :] = 1
    feats = tapped_features(target, ids, drafter.config.target_layer_ids, attention_mask=mask)
    cache = drafter.init_cache(len(lengths), capacity=4)
    drafter.extend_context(cache, feats[:, :-1], mask[:, :-1].bool())
    return ids, mask, feats, cache


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("head", ["markov", "rnn", "none"])
def test_proposal_shapes_and_dtypes(kind, head):
    target = make_target(kind)
    drafter = make_drafter(target, head_type=head)
    if kind == "qwen3":
        assert drafter.layers[0].self_attn.q_norm is not None
    ids, _, _, cache = _context(target, drafter, [7, 5, 9])
    proposal = drafter.propose(ids[:, -1], cache, do_sample=True)
    gamma, vocab = drafter.config.block_size, target.config.vocab_size
    assert proposal.draft_ids.shape == (3, gamma) and proposal.draft_ids.dtype == torch.long
    assert proposal.draft_probs.shape == (3, gamma, vocab) and proposal.draft_probs.dtype == torch.float32
    assert torch.allclose(proposal.draft_probs.sum(-1), torch.ones(3, gamma))
    assert proposal.confidence.shape == (3, gamma)
    assert ((proposal.confidence > 0) & (proposal.confidence < 1)).all()
    assert cache.lengths.tolist() == [6, 4, 8]


def test_bf16_follows_target():
    target = make_target("llama").to(torch.bfloat16)
    drafter = make_drafter(target)
    assert drafter.fc.weight.dtype == torch.bfloat16
    ids, _, _, cache = _context(target, drafter, [6, 4])
    proposal = drafter.propose(ids[:, -1], cache)
    assert proposal.draft_ids.shape == (2, drafter.config.block_size)


@pytest.mark.parametrize("head", ["markov", "rnn"])
def test_draft_probability_equals_softmax_of_u_plus_b_recomputed_teacher_forced(head):
    """p_draft(x_k) from the sequential sampler equals softmax(U_k + B_k) from the independent teacher-forced path."""
    target = make_target("llama")
    drafter = make_drafter(target, head_type=head)
    ids, _, _, cache = _context(target, drafter, [8])
    torch.manual_seed(3)
    proposal = drafter.propose(ids[:, -1], cache, do_sample=True)
    gamma = drafter.config.block_size
    seq = torch.cat([ids, proposal.draft_ids], dim=1)  # anchor at position 7, drafts after it
    feats = tapped_features(target, seq, drafter.config.target_layer_ids)
    out = drafter(feats, seq, anchor_positions=torch.tensor([[7]]))
    recomputed = torch.softmax(out.logits[0, 0], dim=-1)  # [γ, V]
    expected = recomputed.gather(-1, proposal.draft_ids[0, :, None]).squeeze(-1)
    torch.testing.assert_close(proposal.draft_token_probs[0], expected, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(proposal.draft_probs[0], recomputed, rtol=1e-4, atol=1e-6)
    conf = torch.sigmoid(out.confidence_logits[0, 0])
    torch.testing.assert_close(proposal.confidence[0], conf, rtol=1e-4, atol=1e-6)
    assert out.logits.shape == (1, 1, gamma, target.config.vocab_size)


def test_logits_processor_is_applied_with_the_draft_prefix():
    target = make_target("llama")
    drafter = make_drafter(target)
    ids, _, _, cache = _context(target, drafter, [6, 6])
    seen = []

    def forbid_token_five(k, drafts_so_far, logits):
        seen.append(drafts_so_far.shape)
        logits = logits.clone()
        logits[:, 5] = -float("inf")
        return logits

    proposal = drafter.propose(ids[:, -1], cache, logits_processor=forbid_token_five, return_probs=True)
    assert [s[1] for s in seen] == list(range(drafter.config.block_size))
    assert (proposal.draft_ids != 5).all() and (proposal.draft_probs[..., 5] == 0).all()


@pytest.mark.parametrize("head", ["markov", "rnn", "none"])
def test_batched_proposals_equal_per_row(head):
    target = make_target("qwen3")
    drafter = make_drafter(target, head_type=head)
    lengths = [9, 4, 6]
    ids, mask, feats, cache = _context(target, drafter, lengths)
    batched = drafter.propose(ids[:, -1], cache, return_probs=True)
    for r, n in enumerate(lengths):
        row_cache = drafter.init_cache(1)
        drafter.extend_context(row_cache, feats[r : r + 1, -n:-1], mask[r : r + 1, -n:-1].bool())
        single = drafter.propose(ids[r : r + 1, -1], row_cache, return_probs=True)
        assert torch.equal(single.draft_ids[0], batched.draft_ids[r])
        torch.testing.assert_close(single.draft_probs[0], batched.draft_probs[r], rtol=1e-4, atol=1e-6)


def test_incremental_context_equals_one_shot():
    """Appending ragged per-row chunks gives the same cache as one append of the whole context."""
    target = make_target("llama")
    drafter = make_drafter(target)
    _, _, feats, cache = _context(target, drafter, [8, 8])
    stepwise = drafter.init_cache(2, capacity=2)
    drafter.extend_context(stepwise, feats[:, :3], torch.tensor([[1, 1, 1], [1, 0, 0]]).bool())
    drafter.extend_context(stepwise, feats[:, 3:], torch.ones(2, 5, dtype=torch.bool))
    second = torch.cat([feats[1:, 1:3], feats[1:, 3:]], dim=1)  # row 1 skipped 2 entries in the first chunk
    assert stepwise.lengths.tolist() == [8, 6]
    one_shot = drafter.init_cache(1)
    drafter.extend_context(one_shot, torch.cat([feats[1:, :1], feats[1:, 3:]], 1), torch.ones(1, 6).bool())
    for layer in range(len(drafter.layers)):
        torch.testing.assert_close(stepwise.keys[layer][0, :, :7], cache.keys[layer][0, :, :7])
        torch.testing.assert_close(stepwise.keys[layer][1, :, :6], one_shot.keys[layer][0, :, :6])
    assert second.shape[1] == 7


def test_save_load_round_trip_is_exact_and_excludes_shared_weights(tmp_path):
    target = make_target("llama")
    drafter = make_drafter(target, mask_token_id=None)
    drafter.save_pretrained(tmp_path)
    files = {p.name for p in tmp_path.iterdir()}
    assert "model.safetensors" in files and not any(f.endswith(".bin") for f in files)
    from safetensors import safe_open

    with safe_open(tmp_path / "model.safetensors", "pt") as handle:
        names = set(handle.keys())
    assert not any("embed_tokens" in n or "lm_head" in n for n in names)
    assert "markov_head.markov_w1.weight" in names and "mask_embedding" in names
    loaded = DSparkDrafter.from_pretrained(tmp_path, target=target)
    for (name, a), (_, b) in zip(drafter.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    auto = AutoModel.from_pretrained(tmp_path)
    assert isinstance(auto, DSparkDrafter) and not auto.is_bound


def test_unbound_drafter_fails_clearly(tmp_path):
    drafter = DSparkDrafter(DSparkConfig.from_target(make_target("llama").config, block_size=3))
    with pytest.raises(RuntimeError, match="bind_target"):
        drafter.propose(torch.tensor([1]), drafter.init_cache(1))


def test_bind_errors_say_what_is_wrong():
    target = make_target("llama")
    other_vocab = make_target("llama", vocab_size=80)
    drafter = DSparkDrafter(DSparkConfig.from_target(target.config, block_size=3, target_layer_ids=[0]))
    with pytest.raises(ValueError, match="vocabulary: the drafter was built for 96 tokens"):
        drafter.bind_target(other_vocab)
    wider = make_target("llama", hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1)
    with pytest.raises(ValueError, match="hidden size: the drafter has 64, the target 32"):
        drafter.bind_target(wider)


def test_block_sparse_training_attention_equals_the_dense_reference():
    """Teacher-forced forward: the block-sparse attention gives the dense masked attention's outputs."""
    from tests.helpers import make_drafter, make_target, tapped_features

    target = make_target("llama", seed=2)
    drafter = make_drafter(target, block_size=3)
    ids = torch.randint(1, target.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 9:] = False
    feats = tapped_features(target, ids, drafter.config.target_layer_ids)
    anchors = torch.tensor([[0, 3, 4, 8, -1], [2, 5, 6, -1, -1]])
    sparse = drafter(target_hidden=feats, input_ids=ids, anchor_positions=anchors, context_mask=mask)
    dense = drafter(target_hidden=feats, input_ids=ids, anchor_positions=anchors, context_mask=mask,
                    block_sparse=False)
    used = anchors >= 0
    torch.testing.assert_close(sparse.logits[used], dense.logits[used], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(sparse.confidence_logits[used], dense.confidence_logits[used], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bad", ["some/string", 3, "config"])
def test_from_pretrained_with_a_target_that_is_not_a_model_is_a_type_error(tmp_path, bad):
    target = make_target("llama")
    make_drafter(target).save_pretrained(tmp_path)
    bad = target.config if bad == "config" else bad
    shown = "a LlamaConfig" if bad is target.config else f"the {type(bad).__name__} {bad!r}"
    expected = rf"target must be the loaded target model .*got {shown}; load it first, e\.g\. target = AutoModel"
    with pytest.raises(TypeError, match=expected):
        DSparkDrafter.from_pretrained(tmp_path, target=bad)
    with pytest.raises(TypeError, match="target must be the loaded target model"):
        DSparkDrafter(DSparkConfig.from_target(target.config, block_size=3)).bind_target(bad)


def test_save_pretrained_onto_a_file_is_refused_before_writing(tmp_path):
    drafter = make_drafter(make_target("llama"))
    existing = tmp_path / "notes.txt"
    existing.write_text("keep me")
    with pytest.raises(NotADirectoryError, match=rf"save_pretrained: {existing} is an existing file, not a folder"):
        drafter.save_pretrained(existing)
    with pytest.raises(NotADirectoryError, match=rf"cannot create the folder {existing}/sub: {existing} is a file"):
        drafter.save_pretrained(existing / "sub")
    assert existing.read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
