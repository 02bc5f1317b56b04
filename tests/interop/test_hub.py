"""Hub-ready native folders: files, config metadata (auto_map), model card, and an offline trust_remote_code load."""

import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard

from hf_dspark import DSparkDrafter
from hf_dspark.interop import save_for_hub, write_model_card
from hf_dspark.interop.hub import card_template
from tests.helpers import make_drafter, make_target

FACTS = dict(
    base_model="HuggingFaceTB/SmolLM2-135M-Instruct",
    training_data=["HuggingFaceH4/ultrachat_200k", "openai/gsm8k"],
    budget="2.5 CPU-hours, 3000 steps",
    tau_table={"gsm8k": {"greedy": 3.21, "T=0.7": 2.875}, "mt-bench": {"greedy": 2.5, "T=0.7": 2.25}},
    license="apache-2.0",
    repo_id="someone/smollm2-dspark",
)


def test_save_for_hub_writes_a_self_describing_folder(tmp_path):
    target = make_target("llama")
    drafter = make_drafter(target, mask_token_id=95)
    out = save_for_hub(drafter, tmp_path / "hub", **FACTS)
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors", "hf_dspark_auto.py", "README.md"}
    raw = json.loads((out / "config.json").read_text())
    assert raw["model_type"] == "dspark" and raw["sample_from_anchor"] is True
    assert raw["auto_map"] == {
        "AutoConfig": "hf_dspark_auto.DSparkConfig", "AutoModel": "hf_dspark_auto.DSparkDrafter"
    }
    shim = (out / "hf_dspark_auto.py").read_text()
    assert "from hf_dspark import DSparkDrafter as _DSparkDrafter" in shim and "import os" not in shim

    readme = (out / "README.md").read_text()
    meta = ModelCard.load(out / "README.md").data  # the Hub's own parser reads the metadata back
    assert meta.license == "apache-2.0" and meta.base_model == FACTS["base_model"]
    assert meta.library_name == "transformers" and "speculative-decoding" in meta.tags
    assert meta.datasets == FACTS["training_data"]
    for needle in ("HuggingFaceH4/ultrachat_200k", "2.5 CPU-hours, 3000 steps", "| gsm8k | 3.21 | 2.88 |",
                   "| eval set | greedy | T=0.7 |", "assistant_model=drafter",
                   'DSparkDrafter.from_pretrained("someone/smollm2-dspark", target=target)', "γ = 4"):
        assert needle in readme, needle
    assert "{{" not in readme and "{%" not in readme  # every template placeholder was filled

    loaded = DSparkDrafter.from_pretrained(out, target=target)
    for (name, a), (_, b) in zip(drafter.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name


def test_model_card_without_facts_says_what_is_missing(tmp_path):
    target = make_target("llama")
    drafter = make_drafter(target)
    drafter.save_pretrained(tmp_path)
    readme = write_model_card(drafter, tmp_path).read_text()
    assert "_Not measured yet._" in readme and "_not recorded_" in readme and "license: apache-2.0" in readme
    assert ModelCard.load(tmp_path / "README.md").data.datasets is None


def test_card_template_is_package_data():
    """The template ships inside the package (a wheel install has no repository folders)."""
    text = resources.files("hf_dspark").joinpath("templates", "dspark_drafter_card.md").read_text()
    assert text == card_template() and "{{ card_data }}" in text


def test_a_custom_template_path_must_exist(tmp_path):
    drafter = make_drafter(make_target("llama"))
    with pytest.raises(FileNotFoundError, match=r"missing\.md not found"):
        write_model_card(drafter, tmp_path, template=tmp_path / "missing.md")


def test_trust_remote_code_loads_the_folder_offline_in_a_fresh_process(tmp_path):
    """A user who only has `pip install hf-dspark` and never imports it loads the drafter through transformers."""
    target = make_target("llama")
    out = save_for_hub(make_drafter(target, mask_token_id=95), tmp_path / "hub", **FACTS)
    script = (
        "import sys\n"
        "from transformers import AutoConfig, AutoModel\n"
        f"path = {str(out)!r}\n"
        "assert 'hf_dspark' not in sys.modules\n"
        "config = AutoConfig.from_pretrained(path, trust_remote_code=True)\n"
        "model = AutoModel.from_pretrained(path, trust_remote_code=True)\n"
        "drafter_class = sys.modules['hf_dspark.drafter'].DSparkDrafter\n"
        "print(type(config).__name__, config.block_size, isinstance(model, drafter_class), model.is_bound)\n"

    )
    env = dict(os.environ, HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    # The folder's hf_dspark_auto.py imported hf_dspark, whose registered classes then serve the load.
    assert result.stdout.strip().splitlines()[-1].split() == ["DSparkConfig", "4", "True", "False"]
