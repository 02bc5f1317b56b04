"""Engine contracts: tiny drafters of every head / layout / draft-vocabulary combination exported for every engine
either satisfy that engine's contract (and load back proposing identically) or are refused naming the engine, the
reason and the fix."""

import itertools
import json

import pytest
import torch
from safetensors import safe_open

from hf_dspark import DSparkDrafter
from hf_dspark.interop import ENGINE_CONTRACTS, check_export, export_drafter, refusals
from hf_dspark.interop.layout_flags import LAYOUT_KEYS, declared_layouts
from tests.helpers import make_drafter, make_target
from tests.interop.test_export import _assert_same, _proposals

HEADS = ("markov", "rnn", "none")
LAYOUTS = (True, False)  # sample_from_anchor
VOCABS = (None, "draft")
COMBOS = list(itertools.product(HEADS, LAYOUTS, VOCABS))
ENGINES = ("vllm", "sglang", "speculators", "deepspec", "tensorrt_llm")


@pytest.fixture(scope="module")
def qwen3_target():
    return make_target("qwen3")


def _drafter(target, head, anchor_first, vocab):
    overrides = dict(head_type=head, mask_token_id=95, sample_from_anchor=anchor_first)
    if not anchor_first:  # 1 + N drafters come from imported checkpoints (z-lab DFlash, SpecForge)
        overrides["source_layout"] = "dflash"
    if head == "none":
        overrides["use_confidence_head"] = False
    drafter = make_drafter(target, **overrides)
    if vocab:
        drafter.restrict_draft_vocab(list(range(0, target.config.vocab_size, 3)))
    return drafter


def _combo_id(combo):
    head, anchor_first, vocab = combo
    return f"{head}-{'anchor' if anchor_first else '1+N'}-{vocab or 'full'}"


def test_every_engine_named_has_a_contract():
    assert set(ENGINES) <= set(ENGINE_CONTRACTS)
    for contract in ENGINE_CONTRACTS.values():
        assert contract.sources and all(s.commit and s.path for s in contract.sources)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("combo", COMBOS, ids=[_combo_id(c) for c in COMBOS])
def test_export_satisfies_the_contract_or_is_refused(tmp_path, qwen3_target, engine, combo):
    drafter = _drafter(qwen3_target, *combo)
    found = refusals(drafter.config, engine)
    out = tmp_path / "engine"
    if found:
        title = ENGINE_CONTRACTS[engine].title
        with pytest.raises(ValueError, match=rf"{title} cannot serve") as info:
            export_drafter(drafter, out, engine=engine)
        assert "Fix:" in str(info.value) and all(r.reason in str(info.value) for r in found)
        assert not out.exists()
        return
    export_drafter(drafter, out, engine=engine, dtype=torch.float32)
    assert check_export(out, engine, target=qwen3_target, drafter=drafter) == []  # values too: ids, rows, taps
    raw = json.loads((out / "config.json").read_text())
    arch = raw["architectures"][0]
    if not drafter.config.sample_from_anchor:
        assert not arch.endswith("DSparkModel")  # a 1 + N drafter never under a DSpark architecture
    assert set(declared_layouts(raw).values()) == {drafter.config.sample_from_anchor}
    readme = (out / "README.md").read_text()
    gamma = drafter.config.block_size
    assert f"## Requirement: num_speculative_tokens = γ = {gamma}\n" in readme
    assert f"exactly γ = {gamma} speculative tokens" in readme and "## Sidecars this engine ignores" in readme
    assert "## Minimum versions" in readme
    loaded = DSparkDrafter.from_pretrained(out, target=qwen3_target)
    assert loaded.config.sample_from_anchor == drafter.config.sample_from_anchor
    dflash = arch == "DFlashDraftModel"
    if not dflash:  # the DFlash architecture carries the backbone only
        for original, reloaded in zip(_proposals(drafter, qwen3_target), _proposals(loaded, qwen3_target)):
            _assert_same(original, reloaded)


def test_every_engine_serves_some_drafter_and_refuses_some(qwen3_target):
    for engine in ENGINES:
        verdicts = {bool(refusals(_drafter(qwen3_target, *c).config, engine)) for c in COMBOS}
        assert verdicts == ({False} if engine == "speculators" else {True, False}), engine
    learned_mask = make_drafter(qwen3_target, mask_token_id=None)
    assert all(refusals(learned_mask.config, engine) for engine in ENGINES)


@pytest.mark.parametrize("engine", ["vllm", "speculators"])
def test_draft_vocabulary_exports_a_pruned_lm_head_and_d2t(tmp_path, qwen3_target, engine):
    drafter = _drafter(qwen3_target, "markov", True, "draft")
    out = export_drafter(drafter, tmp_path / engine, engine=engine)
    size = drafter.config.draft_vocab_size
    with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
        names = set(handle.keys())
        lm_head, d2t = handle.get_tensor("lm_head.weight"), handle.get_tensor("d2t")
    assert lm_head.shape == (size, qwen3_target.config.hidden_size) and lm_head.dtype == torch.bfloat16
    ids = drafter.draft_token_ids()
    assert torch.equal(lm_head, qwen3_target.get_output_embeddings().weight[ids].to(torch.bfloat16))
    assert d2t.dtype == torch.int64 and torch.equal(torch.arange(size) + d2t, ids)
    assert ("t2d" in names) == (engine == "speculators")  # vLLM skips t2d; only speculators loads it
    raw = json.loads((out / "config.json").read_text())
    assert raw["draft_vocab_size"] == size and raw["dtype"] == "bfloat16"
    if engine == "vllm":
        assert set(LAYOUT_KEYS) <= set(raw) and set(LAYOUT_KEYS) <= set(raw["dflash_config"])


def test_sglang_refuses_a_draft_vocabulary_naming_the_fix(tmp_path, qwen3_target):
    drafter = _drafter(qwen3_target, "markov", True, "draft")
    with pytest.raises(
        ValueError,
        match=r"SGLang.*draft vocabulary.*Fix: export with --engine speculators or "
        r"--engine vllm",
    ):
        export_drafter(drafter, tmp_path / "sglang", engine="sglang")


def test_check_export_catches_a_shifted_or_unpruned_folder(tmp_path, qwen3_target):
    drafter = _drafter(qwen3_target, "markov", True, "draft")
    out = export_drafter(drafter, tmp_path / "vllm", engine="vllm")
    assert check_export(out, "vllm") == []
    sglang = check_export(out, "sglang")  # a vLLM draft-vocabulary folder breaks SGLang's loader
    assert any("draft_vocab_size" in p for p in sglang) and any("d2t" in p for p in sglang)
    raw = json.loads((out / "config.json").read_text())
    raw["dspark_bonus_anchor"] = True  # now disagrees with sample_from_anchor
    (out / "config.json").write_text(json.dumps(raw))
    assert any("disagree" in p for p in check_export(out, "vllm"))


def test_the_shipped_drafter_verdicts_per_engine():
    """The shipped DSpark drafter (8,192-token draft vocabulary, llama layers with per-head q/k RMSNorms since v7):
    vLLM and speculators take it as it is; SGLang refuses its draft vocabulary, naming the fix; without the q/k
    norms (v6 and earlier) every engine's draft layers would not match it, and that is the one reason given."""
    from hf_dspark import DSparkConfig
    from hf_dspark.defaults import default_drafter_dir

    config = DSparkConfig.from_pretrained(default_drafter_dir("dspark"))
    assert config.draft_vocab_size == 8192 and config.sample_from_anchor and config.use_qk_norm
    assert refusals(config, "vllm") == [] and refusals(config, "speculators") == []
    sglang = " ".join(str(r) for r in refusals(config, "sglang"))
    assert (
        "8192-token draft vocabulary" in sglang and "Fix: export with --engine speculators or --engine vllm" in sglang
    )
    without_norms = DSparkConfig.from_dict(config.to_dict() | {"use_qk_norm": False})
    for engine in ("vllm", "speculators"):
        reasons = [r.reason for r in refusals(without_norms, engine)]
        assert len(reasons) == 1 and "q/k RMSNorms" in reasons[0], engine


@pytest.mark.parametrize(
    ("engine", "head", "anchor_first"),
    [
        ("deepspec", "markov", True),
        ("vllm", "markov", True),
        ("sglang", "none", True),
        ("vllm", "none", False),
        ("sglang", "none", False),
    ],
)
def test_exports_propose_like_the_reference_implementation(tmp_path, qwen3_target, engine, head, anchor_first):
    """The reference forward written from DeepSpec's equations, run on the exported folder's own tensors and
    config, drafts what the drafter loaded back from that folder drafts."""
    from tests.interop.test_read_layouts import _check_rows, _prompts, _propose

    out = export_drafter(
        _drafter(qwen3_target, head, anchor_first, None), tmp_path / "e", engine=engine, dtype=torch.float32
    )
    loaded = DSparkDrafter.from_pretrained(out, target=qwen3_target)
    ids, mask = _prompts(qwen3_target, [9, 5, 7])
    proposal, feats = _propose(loaded, qwen3_target, ids, mask)
    checked = list(_check_rows(proposal, out, qwen3_target, ids, mask, feats, loaded.config.first_draft_slot))
    for r, conf in checked:
        torch.testing.assert_close(proposal.confidence_logits[r], conf, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("anchor_first", [True, False])
def test_vllm_exports_declare_bidirectional_blocks_and_causal_configs_are_caught(tmp_path, qwen3_target, anchor_first):
    """vLLM picks causal or bidirectional block attention per draft layer (is_causal, then dflash_config.causal, then
    sliding layer_types); the export says causal: false, and a folder that would run causal fails the contract."""
    head = "markov" if anchor_first else "none"
    out = export_drafter(_drafter(qwen3_target, head, anchor_first, None), tmp_path / "vllm", engine="vllm")
    raw = json.loads((out / "config.json").read_text())
    assert raw["dflash_config"]["causal"] is False and check_export(out, "vllm") == []
    for edit, expected in (
        (  # without the explicit key, sliding layers decide (the explicit causal: false would win)
            {
                "layer_types": ["sliding_attention"] * raw["num_hidden_layers"],
                "dflash_config": {k: v for k, v in raw["dflash_config"].items() if k != "causal"},
            },
            "sliding_attention",
        ),
        ({"dflash_config": raw["dflash_config"] | {"causal": True}}, "dflash_config.causal is True"),
        ({"is_causal": True}, "is_causal is True"),
    ):
        (out / "config.json").write_text(json.dumps(raw | edit))
        assert any(expected in p for p in check_export(out, "vllm")), edit
    (out / "config.json").write_text(json.dumps(raw | {"dflash_config": raw["dflash_config"] | {"causal": True}}))
    with pytest.raises(ValueError, match=r"dflash_config\.causal=true; hf-dspark blocks attend bidirectionally"):
        DSparkDrafter.from_pretrained(out, target=qwen3_target)


def test_tensorrt_llm_refuses_what_its_fixed_qwen3_layers_cannot_run(tmp_path, qwen3_target):
    """TensorRT-LLM's dense Qwen3 DSpark class: SiLU MLP, no attention bias, capture layers sorted, no draft
    vocabulary; `tensorrt-llm` names the same contract."""
    served = _drafter(qwen3_target, "rnn", True, None)
    assert refusals(served.config, "tensorrt-llm") == []
    out = export_drafter(served, tmp_path / "trt", engine="tensorrt-llm", dtype=torch.float32)
    assert check_export(out, "tensorrt_llm") == []
    assert f"max_draft_len: {served.config.block_size}" in (out / "README.md").read_text()
    gelu = make_drafter(qwen3_target, mask_token_id=95, hidden_act="gelu")
    assert any("hidden_act='gelu'" in r.reason for r in refusals(gelu.config, "tensorrt_llm"))
    assert refusals(gelu.config, "vllm") == []
    unsorted = make_drafter(qwen3_target, mask_token_id=95, target_layer_ids=[1, 0])
    assert any("strictly increasing" in r.reason for r in refusals(unsorted.config, "tensorrt_llm"))
    with pytest.raises(ValueError, match=r"(?s)TensorRT-LLM cannot serve.*draft vocabulary"):
        export_drafter(_drafter(qwen3_target, "markov", True, "draft"), tmp_path / "v", engine="tensorrt-llm")


@pytest.mark.parametrize("engine", ENGINES)
def test_an_embedding_tap_exports_where_the_engine_reads_it_and_is_refused_elsewhere(tmp_path, qwen3_target, engine):
    drafter = make_drafter(qwen3_target, head_type="markov", mask_token_id=95, target_layer_ids=[-1, 2])
    out = tmp_path / engine
    if not ENGINE_CONTRACTS[engine].embedding_tap:
        with pytest.raises(ValueError, match=r"embedding output \(target layer id -1\).*Fix:"):
            export_drafter(drafter, out, engine=engine)
        return
    if refusals(drafter.config, engine):  # refused for another reason (e.g. no q/k norms): not about the tap
        assert not any("embedding output" in r.reason for r in refusals(drafter.config, engine))
        return
    export_drafter(drafter, out, engine=engine, dtype=torch.float32)
    assert check_export(out, engine) == []
    loaded = DSparkDrafter.from_pretrained(out, target=qwen3_target)
    assert loaded.config.target_layer_ids == [-1, 2]
    for original, reloaded in zip(_proposals(drafter, qwen3_target), _proposals(loaded, qwen3_target)):
        _assert_same(original, reloaded)


@pytest.mark.parametrize("engine", ["vllm", "speculators"])
def test_fields_whose_engine_defaults_differ_must_be_written(tmp_path, qwen3_target, engine):
    """confidence_head_with_markov (vLLM assumes false, DeepSpec and speculators true), rope_theta (vLLM's DFlash
    backbone assumes 1e6), hidden_act and the block causality: an export spells each out, and check_export names a
    folder that leaves one to the engine."""
    out = export_drafter(_drafter(qwen3_target, "markov", True, None), tmp_path / engine, engine=engine)
    raw = json.loads((out / "config.json").read_text())
    assert check_export(out, engine) == []
    nested = "transformer_layer_config" if engine == "speculators" else None
    for key in ("rope_theta", "hidden_act", "confidence_head_with_markov", "causal"):
        edited = json.loads(json.dumps(raw))
        layers = edited[nested] if nested and key != "confidence_head_with_markov" else edited
        if key == "rope_theta":
            layers.pop("rope_theta")
            layers["rope_parameters"].pop("rope_theta")
        elif key == "causal":
            layers.pop("is_causal", None)
            edited.get("dflash_config", {}).pop("causal", None)
        else:
            layers.pop(key)
        (out / "config.json").write_text(json.dumps(edited))
        problems = check_export(out, engine)
        spelled = "is_causal" if key == "causal" else key
        assert any(spelled in p and ("explicit" in p or "missing" in p) for p in problems), (key, problems)
