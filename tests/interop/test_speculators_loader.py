"""`hf-dspark export --engine speculators` folders load with speculators' own `SpeculatorModel.from_pretrained`:
every tensor unchanged, every field its loader reads written, the values its engine derives (draft ids, vocabulary
rows, taps) the drafter's; what speculators itself saves passes `check_export` too."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_dspark.cli import main as cli_main
from hf_dspark.interop import check_export
from tests.helpers import make_drafter, make_target

speculators = pytest.importorskip(
    "speculators",
    reason="speculators is not installed (`pip install -e .[interop]`, or `pip install --no-deps speculators` "
    "plus its light dependencies on a CPU-only machine: docs/checkpoints.md)",
)

# What speculators' DFlash/DSpark classes read from transformer_layer_config (some versions as bare attributes).
LAYER_FIELDS_READ = (
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
    "rms_norm_eps", "rope_parameters", "max_position_embeddings", "attention_bias", "attention_dropout", "vocab_size",
    "num_hidden_layers", "layer_types", "sliding_window",
)
HEADS = {"markov": {}, "rnn": dict(confidence_with_markov=False), "none": dict(use_confidence_head=False)}
LAYOUTS = {"anchor": {}, "1+N": dict(sample_from_anchor=False, source_layout="dflash")}
CASES = {  # every head, layout and vocabulary on a Qwen3 target; a Llama target (q/k norms) both ways
    f"qwen3-{head}-{layout}-{'draft-vocab' if vocab else 'full'}": ("qwen3", dict(head_type=head, vocab=vocab,
                                                                                 **HEADS[head], **LAYOUTS[layout]))
    for head in HEADS for layout in LAYOUTS for vocab in (False, True)
} | {
    "llama-markov-anchor-full": ("llama", dict(head_type="markov", use_qk_norm=True)),
    "llama-rnn-1+N-draft-vocab": ("llama", dict(head_type="rnn", use_qk_norm=True, vocab=True, **LAYOUTS["1+N"])),
}


def _export(tmp_path, kind, overrides):
    target = make_target(kind, seed=4)
    overrides = dict(overrides)
    vocab = overrides.pop("vocab", False)
    drafter = make_drafter(target, mask_token_id=95, **overrides)
    if vocab:
        drafter.restrict_draft_vocab(list(range(1, target.config.vocab_size, 3)))
    target.save_pretrained(tmp_path / "target")
    drafter.save_pretrained(tmp_path / "drafter")
    out = tmp_path / "speculators"
    argv = ["export", "--engine", "speculators", "--dtype", "float32", "--drafter", str(tmp_path / "drafter"),
            "--target", str(tmp_path / "target"), str(out)]
    assert cli_main(argv) == 0
    return target, drafter, out


@pytest.mark.parametrize("case", list(CASES))
def test_speculators_loads_every_export_unchanged(tmp_path, case):
    kind, overrides = CASES[case]
    target, drafter, out = _export(tmp_path, kind, overrides)
    assert check_export(out, "speculators", target=target, drafter=drafter) == []
    readme = (out / "README.md").read_text()
    assert "## Minimum versions\n\n- speculators >= 0.7.0" in readme and "vllm-project/vllm#48639" in readme
    model = speculators.SpeculatorModel.from_pretrained(str(out))
    assert type(model).__name__ == "DSparkDraftModel"
    config = model.config
    assert config.sample_from_anchor == drafter.config.sample_from_anchor
    assert config.block_size == drafter.config.num_block_slots
    assert config.aux_hidden_state_layer_ids == [i + 1 for i in drafter.config.target_layer_ids]
    assert (model.markov_head is None) == (drafter.config.head_type == "none")
    assert (model.confidence_head is None) == (not drafter.config.use_confidence_head)
    layers = config.transformer_layer_config
    assert type(layers).model_type == kind
    assert all(hasattr(layers, name) for name in LAYER_FIELDS_READ), [n for n in LAYER_FIELDS_READ
                                                                        if not hasattr(layers, n)]
    assert layers.sliding_window is None and set(layers.layer_types) == {"full_attention"}
    loaded = model.state_dict()
    written = load_file(out / "model.safetensors")
    for name, tensor in written.items():
        assert name in loaded and torch.equal(loaded[name].to(tensor.dtype), tensor), name
    if drafter.config.draft_vocab_size is None:  # rebuilt from the verifier: the target's own rows
        assert torch.equal(loaded["lm_head.weight"], target.lm_head.weight.detach())
    assert torch.equal(loaded["embed_tokens.weight"], target.get_input_embeddings().weight.detach())


def test_what_speculators_saves_passes_check_export(tmp_path):
    target, drafter, out = _export(tmp_path, "qwen3", dict(head_type="markov", vocab=True))
    model = speculators.SpeculatorModel.from_pretrained(str(out))
    model.save_pretrained(tmp_path / "resaved")
    raw = json.loads((tmp_path / "resaved" / "config.json").read_text())
    assert raw["architectures"] == ["DSparkDraftModel"]  # its class name, not the config's default
    assert check_export(tmp_path / "resaved", "speculators", target=target, drafter=drafter) == []


def test_check_export_catches_what_speculators_would_load_differently(tmp_path):
    target, drafter, out = _export(tmp_path, "llama", dict(head_type="markov", use_qk_norm=True, vocab=True))
    raw = json.loads((out / "config.json").read_text())
    tensors = load_file(out / "model.safetensors")
    layers = {k: v for k, v in raw["transformer_layer_config"].items() if k != "sliding_window"}
    (out / "config.json").write_text(json.dumps(raw | {"transformer_layer_config": layers}))
    assert any("transformer_layer_config.sliding_window is not written" in p for p in check_export(out, "speculators"))
    with pytest.raises(AttributeError, match="sliding_window"):  # what a loader reading the attribute meets
        _ = speculators.SpeculatorModel.from_pretrained(str(out)).config.transformer_layer_config.sliding_window
    (out / "config.json").write_text(json.dumps(raw | {"aux_hidden_state_layer_ids": [0, 2]}))
    assert any("taps decoder layers [-1, 1]" in p for p in check_export(out, "speculators", drafter=drafter))
    (out / "config.json").write_text(json.dumps(raw))
    shifted = dict(tensors, d2t=tensors["d2t"] + 1)
    save_file(shifted, out / "model.safetensors")
    problems = check_export(out, "speculators", target=target, drafter=drafter)
    assert any("t2d does not mark exactly the draft ids" in p for p in problems)
    rows = dict(tensors, **{"lm_head.weight": tensors["lm_head.weight"].roll(1, 0)})
    save_file(rows, out / "model.safetensors")
    assert check_export(out, "speculators", drafter=drafter) == []  # headers and ids alone cannot see it
    assert any("LM-head rows" in p for p in check_export(out, "speculators", target=target))
