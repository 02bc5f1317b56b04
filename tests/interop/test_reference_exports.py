"""Draft-vocabulary and RNN-head exports, read the way an engine reads them: the reference (tests/interop/
reference_exports.py), given only the exported config.json and safetensors, proposes the same draft ids with the
same probabilities and confidence logits as the drafter (before export and loaded back). Engines that cannot serve
such a drafter refuse it naming themselves and a fix that points at an engine that can."""

import itertools
import json
import re
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_dspark import DSparkDrafter
from hf_dspark.interop import ENGINE_CONTRACTS, check_export, export_drafter, refusals
from tests.helpers import make_target
from tests.interop.reference_exports import read_export, reference_export_proposals
from tests.interop.test_contracts import ENGINES, _drafter
from tests.interop.test_read_layouts import _prompts, _propose

# (engine, head, anchor_first, vocabulary): every export of an RNN head or a draft vocabulary an engine serves
SERVED = [
    ("vllm", "markov", True, "draft"),
    ("vllm", "none", True, "draft"),
    ("speculators", "markov", True, "draft"),
    ("speculators", "markov", False, "draft"),
    ("speculators", "none", True, "draft"),
    ("speculators", "none", False, "draft"),
    ("speculators", "rnn", True, None),
    ("speculators", "rnn", False, None),
    ("speculators", "rnn", True, "draft"),
    ("speculators", "rnn", False, "draft"),
    ("deepspec", "rnn", True, None),
    ("tensorrt_llm", "rnn", True, None),
]
CANDIDATES = [
    (engine, head, anchor_first, vocab)
    for engine, (head, anchor_first, vocab) in itertools.product(
        ENGINES, itertools.product(("markov", "rnn", "none"), (True, False), (None, "draft"))
    )
    if head == "rnn" or vocab
]
REFUSED = [case for case in CANDIDATES if case not in SERVED]


def _case_id(case):
    engine, head, anchor_first, vocab = case
    return f"{engine}-{head}-{'anchor' if anchor_first else '1+N'}-{vocab or 'full'}"


@pytest.fixture(scope="module")
def qwen3_target():
    return make_target("qwen3")


def _strong_heads(drafter, seed=3):
    """Head weights large enough that the sequential bias and the confidence logit move the drafts (the default
    initialisation makes both negligible next to U_k)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in drafter.named_parameters():
            if name.startswith(("markov_head.", "confidence_head.")):
                param.copy_(0.7 * torch.randn(param.shape, generator=gen))
    return drafter


def _export(tmp_path, target, case):
    engine, head, anchor_first, vocab = case
    drafter = _strong_heads(_drafter(target, head, anchor_first, vocab))
    out = export_drafter(drafter, tmp_path / engine, engine=engine, dtype=torch.float32)
    assert check_export(out, engine) == []
    return drafter, out


def _assert_matches(proposal, reference, greedy_temperatures):
    drafts, probs, conf = reference
    assert torch.equal(proposal.draft_ids, drafts)
    torch.testing.assert_close(proposal.draft_probs, probs, rtol=1e-5, atol=1e-6)
    assert (proposal.confidence_logits is None) == (conf is None)
    if conf is not None:
        torch.testing.assert_close(proposal.confidence_logits, conf, rtol=1e-5, atol=1e-5)
        expected = torch.sigmoid(conf / torch.tensor(greedy_temperatures))
        torch.testing.assert_close(proposal.confidence, expected, rtol=1e-5, atol=1e-6)


def test_the_cases_are_exactly_what_the_engines_serve(qwen3_target):
    for case in CANDIDATES:
        engine, *combo = case
        assert (refusals(_drafter(qwen3_target, *combo).config, engine) == []) == (case in SERVED), case


@pytest.mark.parametrize("case", SERVED, ids=[_case_id(c) for c in SERVED])
def test_the_reference_reads_the_export_and_proposes_like_the_drafter(tmp_path, qwen3_target, case):
    drafter, out = _export(tmp_path, qwen3_target, case)
    spec, weights = read_export(out)
    assert spec.gamma == drafter.config.block_size and spec.first_slot == drafter.config.first_draft_slot
    assert spec.head == {"markov": "vanilla", "rnn": "rnn", "none": None}[case[1]]
    ids, mask = _prompts(qwen3_target, [9, 5, 7])
    reference = reference_export_proposals(out, qwen3_target, ids, mask)
    greedy = json.loads((out / "calibration.json").read_text())["greedy"]
    loaded = DSparkDrafter.from_pretrained(out, target=qwen3_target)
    for model in (drafter, loaded):
        proposal, _ = _propose(model, qwen3_target, ids, mask)
        _assert_matches(proposal, reference, greedy)
    allowed = drafter.draft_token_ids()
    if case[3]:
        assert "d2t" in weights and bool(torch.isin(reference[0], allowed).all())
        assert bool((reference[1][..., ~drafter.t2d] == 0).all())


def test_a_misread_head_or_vocabulary_map_changes_what_the_reference_proposes(tmp_path, qwen3_target):
    """The agreement above is not vacuous: reading the RNN head as a vanilla one, dropping the head, or taking
    draft ids for target ids (ignoring d2t) each changes the reference's proposals."""
    ids, mask = _prompts(qwen3_target, [9, 5, 7])
    _, out = _export(tmp_path / "rnn", qwen3_target, ("deepspec", "rnn", True, None))
    spec, _ = read_export(out)
    drafts, probs, _ = reference_export_proposals(out, qwen3_target, ids, mask)
    for misread in (replace(spec, head="vanilla"), replace(spec, head=None, confidence=False)):
        other, other_probs, _ = reference_export_proposals(out, qwen3_target, ids, mask, spec=misread)
        assert not torch.equal(other, drafts) and not torch.allclose(other_probs, probs, atol=1e-3)
    _, out = _export(tmp_path / "vocab", qwen3_target, ("vllm", "markov", True, "draft"))
    drafts, _, _ = reference_export_proposals(out, qwen3_target, ids, mask)
    tensors = load_file(out / "model.safetensors")
    save_file(tensors | {"d2t": torch.zeros_like(tensors["d2t"])}, out / "model.safetensors")
    assert not torch.equal(reference_export_proposals(out, qwen3_target, ids, mask)[0], drafts)


@pytest.mark.parametrize("case", REFUSED, ids=[_case_id(c) for c in REFUSED])
def test_engines_refuse_what_they_cannot_serve_naming_themselves_and_a_serving_engine(tmp_path, qwen3_target, case):
    engine, head, anchor_first, vocab = case
    drafter = _drafter(qwen3_target, head, anchor_first, vocab)
    title = ENGINE_CONTRACTS[engine].title
    with pytest.raises(ValueError, match=rf"^{re.escape(title)} cannot serve") as info:
        export_drafter(drafter, tmp_path / engine, engine=engine)
    lines = str(info.value).splitlines()[1:]
    assert lines and all(line.startswith(f"- {title}: ") and " Fix: " in line for line in lines)
    if head == "rnn" and head not in ENGINE_CONTRACTS[engine].head_types:
        assert any("RNN head is not implemented" in line for line in lines)
    if vocab and not ENGINE_CONTRACTS[engine].draft_vocab:
        assert any("draft vocabulary" in line and "--engine speculators" in line for line in lines)
    fixes = " ".join(line.split(" Fix: ", 1)[1] for line in lines)
    named = set(re.findall(r"--engine (\w+)", fixes)) | set(re.findall(r"\b(?:" + "|".join(ENGINES) + r")\b", fixes))
    assert any((e, head, anchor_first, vocab) in SERVED for e in named), fixes
    assert not (tmp_path / engine).exists()
