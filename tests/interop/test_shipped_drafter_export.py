"""The shipped DSpark drafter exported with defaults, on the embedded target: what vLLM and speculators load
(pruned `lm_head [8192, d]` + `d2t`, bfloat16, every layout spelling, all agreeing) and SGLang's refusal (no draft
vocabulary there), and `hf-dspark check-layout` deciding its layout.

Written against the drafter's property rather than one set of weights: every engine's draft layers apply per-head
q/k RMSNorms, so a shipped drafter with `use_qk_norm=True` must export cleanly for vLLM and speculators, and one
without must be refused for exactly that reason."""

import json

import pytest
import torch
from safetensors import safe_open

from hf_dspark import DSparkDrafter
from hf_dspark.defaults import default_drafter_dir
from hf_dspark.interop import check_export, export_drafter, refusals
from hf_dspark.interop.layout_flags import LAYOUT_KEYS, NESTED, declared_layouts

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def shipped():
    from hf_dspark.defaults import load_default_target

    target, _ = load_default_target(dtype=torch.float32, device="cpu")
    return DSparkDrafter.from_pretrained(default_drafter_dir("dspark"), target=target), target


@pytest.mark.parametrize("engine", ["vllm", "speculators"])
def test_shipped_drafter_exports_for_vllm_and_speculators(tmp_path, shipped, engine):
    drafter, target = shipped
    config = drafter.config
    assert config.draft_vocab_size == 8192 and config.sample_from_anchor
    out = tmp_path / engine
    if not config.use_qk_norm:  # the current weights: refused for the q/k norms only, naming the fix
        reasons = [str(r) for r in refusals(config, engine)]
        assert len(reasons) == 1 and "q/k RMSNorms" in reasons[0] and "use_qk_norm=True" in reasons[0]
        with pytest.raises(ValueError, match="q/k RMSNorms"):
            export_drafter(drafter, out, engine=engine)
        assert not out.exists()
        return
    export_drafter(drafter, out, engine=engine)  # defaults: bfloat16, the engine's own layout
    assert check_export(out, engine) == []
    raw = json.loads((out / "config.json").read_text())
    assert raw["draft_vocab_size"] == 8192 and raw["dtype"] == "bfloat16"
    assert set(declared_layouts(raw).values()) == {True}  # anchor-first in every spelling written
    if engine == "vllm":
        assert set(LAYOUT_KEYS) <= set(raw) and set(LAYOUT_KEYS) <= set(raw[NESTED])
        assert raw["architectures"][0].endswith("DSparkModel")
    with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
        names = set(handle.keys())
        lm_head, d2t = handle.get_tensor("lm_head.weight"), handle.get_tensor("d2t")
    ids = drafter.draft_token_ids()
    assert lm_head.shape == (8192, config.hidden_size) and lm_head.dtype == torch.bfloat16
    assert torch.equal(lm_head, target.get_output_embeddings().weight[ids].to(torch.bfloat16))
    assert d2t.dtype == torch.int64 and torch.equal(torch.arange(8192) + d2t, ids)
    assert ("t2d" in names) == (engine == "speculators")


def test_shipped_drafter_is_refused_for_sglang_with_the_reason_and_the_fix(tmp_path, shipped):
    drafter, _ = shipped
    with pytest.raises(ValueError) as info:
        export_drafter(drafter, tmp_path / "sglang", engine="sglang")
    message = str(info.value)
    assert "SGLang" in message and "8192-token draft vocabulary" in message
    assert "Fix: export with --engine speculators or --engine vllm" in message
    assert not (tmp_path / "sglang").exists()


def test_check_layout_is_decisive_on_the_shipped_drafter(capsys):
    """The default probe (the target's greedy reply to a chat prompt, each draft after the whole prompt) tells the
    layout apart on the shipped drafter; on prose continuations from scratch it could not."""
    from hf_dspark.cli import main as cli_main

    assert cli_main(["check-layout", str(default_drafter_dir("dspark"))]) == 0
    out = capsys.readouterr().out
    assert "trained anchor-first: the config is right" in out
