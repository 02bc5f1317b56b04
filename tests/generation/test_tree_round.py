"""Tree rounds (`dspark_tree_budget`): greedy output bit-identical to plain `generate` on every family, batched with
ragged prompts, dynamic and static caches; drafts accepted off the argmax chain; chains when trees cannot run."""

import pytest
import torch

from hf_dspark.generation.tree_round import TreeRoundKernel
from hf_dspark.model.configuration_dspark import DSparkConfig
from hf_dspark.model.modeling_outputs import DSparkProposal
from hf_dspark.proposers import hybrid_for
from hf_dspark.proposers.base import ContextLengths
from hf_dspark.proposers.oracle import OracleDrafter
from hf_dspark.proposers.scoring import LOOKUP
from hf_dspark.target.ragged_cache import new_target_cache
from tests.generation.test_families import FAMILIES, make_family
from tests.helpers import make_drafter, ragged_prompts


class RowContext(ContextLengths):
    """Committed-token counts that remember which generate row each cache row is."""

    def __init__(self, lengths: torch.Tensor, rows: torch.Tensor) -> None:
        super().__init__(lengths)
        self.rows = rows

    def select_rows(self, rows: torch.Tensor) -> "RowContext":
        rows = rows.to("cpu")
        return RowContext(self.lengths.index_select(0, rows), self.rows.index_select(0, rows))

    @staticmethod
    def concat(caches):
        return RowContext(torch.cat([c.lengths for c in caches]), torch.cat([c.rows for c in caches]))


class SecondBestOracle(OracleDrafter):
    """A tree-capable oracle: slot k's distribution ranks the reference token first at odd slots and second, behind
    a wrong token, at even ones, so a chain of argmaxes is cut at slot 2 while a tree with two children a node
    reaches the whole reference."""

    markov_head = None
    confidence_head = None

    def init_cache(self, batch_size: int, capacity: int | None = None) -> RowContext:
        return RowContext(torch.zeros(batch_size, dtype=torch.long), torch.arange(batch_size))

    def draft_token_ids(self):
        return None

    def confidence_temperatures(self, greedy: bool, device) -> torch.Tensor:
        return torch.ones(self.config.block_size, device=device)

    def block_hidden_states(self, anchor_ids: torch.Tensor, cache: RowContext) -> torch.Tensor:
        gamma = self.config.block_size
        hidden = torch.zeros(anchor_ids.shape[0], gamma, dtype=torch.long)
        for a, row in enumerate(cache.rows.tolist()):
            ref = self.reference[row]
            start = int(cache.lengths[a]) + 1
            chunk = ref[start : start + gamma]
            hidden[a, : chunk.shape[0]] = chunk
            hidden[a, chunk.shape[0] :] = ref[-1]
        return hidden

    def propose(self, anchor_ids: torch.Tensor, cache: RowContext, **kwargs) -> DSparkProposal:
        """The chain of argmaxes of the same distributions."""
        drafts = self.lm_logits(self.block_hidden_states(anchor_ids, cache)).argmax(dim=-1)
        ones = torch.ones(drafts.shape)
        return DSparkProposal(drafts, self.one_hot(drafts, bool(kwargs.get("do_sample"))), ones, ones * 0.99)

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        vocab = self.config.vocab_size
        logits = torch.zeros(*hidden.shape, vocab)
        logits.scatter_(-1, hidden[..., None], 4.0)
        wrong = (hidden + 1) % vocab
        slots = torch.arange(hidden.shape[1])
        even = (slots % 2 == 1)[None, :].expand_as(hidden)  # slots 2, 4, ... (1-based)
        logits.scatter_(-1, wrong[..., None], torch.where(even, 5.0, 1.0)[..., None])
        return logits


def second_best_oracle(target, block_size: int, reference, mask) -> SecondBestOracle:
    config = DSparkConfig.from_target(target.config, block_size=block_size, num_hidden_layers=1, head_type="none",
                                      use_confidence_head=False)
    oracle = SecondBestOracle(config)
    oracle.set_reference(reference, mask)
    make_drafter(target)  # enables DSpark generate on the target
    return oracle


def _generate_pair(target, drafter, batch, seed, budget, **kwargs):
    ids, mask = ragged_prompts(batch, seed=seed, min_len=4, max_len=14)
    kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=30, **kwargs)
    reference = target.generate(ids, **kwargs)
    if drafter == "oracle":
        drafter = second_best_oracle(target, 4, reference, mask)
    output = target.generate(ids, assistant_model=drafter, dspark_tree_budget=budget, **kwargs)
    return reference, output, drafter


@pytest.mark.parametrize("name", list(FAMILIES))
def test_tree_greedy_matches_plain_generate_every_family(name):
    target = make_family(name)
    reference, output, _ = _generate_pair(target, make_drafter(target), 3, seed=3, budget=8)
    assert torch.equal(reference, output), name
    reference, output, oracle = _generate_pair(target, "oracle", 3, seed=4, budget=12)
    assert torch.equal(reference, output), name
    assert oracle.last_generation_stats.mean_accepted_length >= 3.0


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma3"])
@pytest.mark.parametrize("batch", [1, 3])
def test_tree_greedy_static_cache(name, batch):
    target = make_family(name)
    reference, output, oracle = _generate_pair(target, "oracle", batch, seed=5, budget=12,
                                               cache_implementation="static")
    assert torch.equal(reference, output)
    assert oracle.last_generation_stats.mean_accepted_length >= 2.0


def test_trees_accept_what_chains_cannot():
    """The oracle's reference sits second at even slots: chains stop there, trees go on."""
    target = make_family("llama")
    _, _, tree_oracle = _generate_pair(target, "oracle", 3, seed=6, budget=12)
    ids, mask = ragged_prompts(3, seed=6, min_len=4, max_len=14)
    kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=30)
    reference = target.generate(ids, **kwargs)
    chain_oracle = second_best_oracle(target, 4, reference, mask)
    assert torch.equal(reference, target.generate(ids, assistant_model=chain_oracle, dspark_policy="fixed",
                                                  **kwargs))
    chain = chain_oracle.last_generation_stats.mean_accepted_length
    tree = tree_oracle.last_generation_stats.mean_accepted_length
    assert chain < 2.5 < tree


def test_trees_with_eos_and_history_free_warpers():
    target = make_family("qwen3")
    drafter = make_drafter(target, head_type="rnn")
    ids, mask = ragged_prompts(3, seed=7, min_len=4, max_len=14)
    kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=25, eos_token_id=[5, 9, 17])
    reference = target.generate(ids, **kwargs)
    assert torch.equal(reference, target.generate(ids, assistant_model=drafter, dspark_tree_budget=6, **kwargs))


def test_fallback_to_chains_is_said_once(caplog):
    """A history-reading processor (repetition penalty) cannot process branches: chains, one log line."""
    from transformers.utils import logging as hf_logging

    target = make_family("llama")
    drafter = make_drafter(target)
    ids, mask = ragged_prompts(2, seed=8, min_len=4, max_len=14)
    kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=12, repetition_penalty=1.3)
    reference = target.generate(ids, **kwargs)
    hf_logging.enable_propagation()
    try:
        with caplog.at_level("WARNING"):
            output = target.generate(ids, assistant_model=drafter, dspark_tree_budget=6, **kwargs)
    finally:
        hf_logging.disable_propagation()
    assert torch.equal(reference, output)
    assert any("verifying chains instead of trees" in r.getMessage() for r in caplog.records)


def test_tree_budget_is_checked():
    target = make_family("llama")
    ids, mask = ragged_prompts(1, seed=9)
    with pytest.raises(ValueError, match="dspark_tree_budget"):
        target.generate(ids, attention_mask=mask, assistant_model=make_drafter(target), dspark_tree_budget=1,
                        max_new_tokens=4)


def test_kernel_refuses_a_one_node_budget():
    target = make_family("llama")
    with pytest.raises(ValueError, match="≥ 2 nodes"):
        TreeRoundKernel(target, make_drafter(target), None, None, False, budget=1)
    assert new_target_cache(target) is not None


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("kind", ["prompt-lookup", "suffix"])
def test_hybrid_tree_greedy_matches_plain_generate(batch, kind):
    """The hybrid's lookup continuation joins the DSpark tree as a branch; both are verified in one forward."""
    target = make_family("llama")
    ids, mask = ragged_prompts(batch, seed=batch + 20, min_len=12, max_len=20)
    ids[:, -6:] = ids[:, -12:-6]  # something to copy
    hybrid = hybrid_for(make_drafter(target, block_size=4), kind)
    kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=40)
    reference = target.generate(ids, **kwargs)
    for _ in range(2):  # the second call also sees the first call's rows (the suffix store)
        assert torch.equal(reference, target.generate(ids, assistant_model=hybrid, dspark_tree_budget=8, **kwargs))
    assert hybrid.source_counts[LOOKUP] > 0


def test_hybrid_tree_accepts_the_lookup_branch():
    """A repeated request: the suffix store's continuation is the whole reference, reached through the tree."""
    target = make_family("llama")
    ids, mask = ragged_prompts(1, seed=5, min_len=6, max_len=6)
    hybrid = hybrid_for(make_drafter(target, block_size=4), "suffix")
    kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=30, dspark_tree_budget=8)
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30)
    target.generate(ids, assistant_model=hybrid, **kwargs)
    assert torch.equal(reference, target.generate(ids, assistant_model=hybrid, **kwargs))
    assert hybrid.last_generation_stats.mean_accepted_length >= 3.0


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampling"])
@pytest.mark.parametrize("batch", [1, 8])
def test_tree_rounds_sync_once(batch, do_sample):
    """A tree round reads the device once (its packed download; a round verifying nothing adds transformers' mask
    check): drafting, shaping, the tree forward and the path commit read nothing back."""
    from transformers import GenerationConfig

    from hf_dspark.diagnostics import COUNTED, SyncCounter
    from hf_dspark.generation import loop as loop_module

    target = make_family("llama", eos_token_id=None)
    drafter = make_drafter(target, seed=4)
    ids, mask = ragged_prompts(batch, seed=batch)
    options = dict(do_sample=do_sample, max_new_tokens=12, dspark_policy="fixed", dspark_tree_budget=8)
    if do_sample:
        options.update(top_k=0, temperature=1.0)
    drafter.__dict__.pop("_temperature_tensors", None)
    counter, rounds, step = SyncCounter(target, drafter, ids, mask), [], loop_module.DSparkLoop.step

    def counted_step(loop):
        before = len(counter.events)
        step(loop)
        rounds.append([e for e in counter.events[before:] if e.kind in COUNTED])

    with pytest.MonkeyPatch.context() as patch, counter:
        patch.setattr(loop_module.DSparkLoop, "step", counted_step)
        config = GenerationConfig(**options)
        target.generate(ids, attention_mask=mask, assistant_model=drafter, generation_config=config)
    assert rounds and max(len(events) for events in rounds) <= 2, [sorted({(e.kind, e.op) for e in r}) for r in rounds]


def test_the_drafter_context_gets_the_accepted_paths_features(monkeypatch):
    """Every committed token's tapped target features reach the drafter once, in order, as a plain forward over the
    final sequence computes them, also when the accepted path leaves the argmax chain (a learned drafter whose
    distributions are the second-best oracle's)."""
    target = make_family("llama")
    drafter = make_drafter(target, head_type="none", use_confidence_head=False)
    ids, mask = ragged_prompts(1, seed=12, min_len=6, max_len=10)
    kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=30)
    reference = target.generate(ids, **kwargs)
    oracle = second_best_oracle(target, 4, reference, mask)
    oracle.config = drafter.config

    def block_hidden_states(anchor_ids, cache):
        return oracle.block_hidden_states(anchor_ids, RowContext(torch.tensor(cache.host_lengths), torch.tensor([0])))

    recorded = []
    extend = drafter.extend_context

    def recording_extend(cache, features, valid, counts=None):
        recorded.append(features[0][valid[0]])
        return extend(cache, features, valid, counts=counts)

    monkeypatch.setattr(drafter, "block_hidden_states", block_hidden_states)
    monkeypatch.setattr(drafter, "lm_logits", oracle.lm_logits)
    monkeypatch.setattr(drafter, "extend_context", recording_extend)
    assert torch.equal(reference, target.generate(ids, assistant_model=drafter, dspark_tree_budget=12, **kwargs))
    assert drafter.last_generation_stats.mean_accepted_length >= 3.0
    seen = torch.cat(recorded)
    sequence = reference[:, int((mask == 0).sum()) :]
    with torch.no_grad():
        hidden = target(sequence, output_hidden_states=True).hidden_states
    expected = torch.cat([hidden[i + 1] for i in drafter.config.target_layer_ids], dim=-1)[0]
    assert seen.shape[0] >= sequence.shape[1] - 8
    torch.testing.assert_close(seen, expected[: seen.shape[0]], atol=1e-4, rtol=1e-4)


def test_an_attention_kernel_without_4d_masks_verifies_chains(caplog):
    """flex attention takes a block mask, not a tree's 4D mask: detected before the first round, said once."""
    from transformers.utils import logging as hf_logging

    from hf_dspark.generation.processors import RowProcessors
    from hf_dspark.generation.round import RoundKernel
    from hf_dspark.generation.tree_round import round_kernel

    target = make_family("llama", attn_implementation="flex_attention")
    drafter = make_drafter(target)
    hf_logging.enable_propagation()
    try:
        with caplog.at_level("WARNING"):
            kernel = round_kernel(8, target, drafter, None, RowProcessors(None, 1), False)
    finally:
        hf_logging.disable_propagation()
    assert type(kernel) is RoundKernel
    assert any("flex_attention" in r.getMessage() and "sdpa" in r.getMessage() for r in caplog.records)
    eager = make_family("llama", attn_implementation="eager")
    assert type(round_kernel(8, eager, make_drafter(eager), None, RowProcessors(None, 1), False)) is TreeRoundKernel
