"""Hub-ready native folders: `save_pretrained` + remote-code entry point + a generated model card.

`auto_map` in a config must name `<file>.<Class>` with the file inside the repo (transformers splits the reference
once on "."), so a package path such as `hf_dspark.DSparkDrafter` cannot be used. The folder gets a small
`hf_dspark_auto.py` that subclasses the installed package's public classes (`from hf_dspark import DSparkConfig,
DSparkDrafter`: never an internal module path, which may move); with `pip install hf-dspark`,
`AutoModel.from_pretrained(repo, trust_remote_code=True)` then loads the drafter offline, and in a process that
already ran `import hf_dspark` the registered local classes are used without remote code. The implementation is
never copied into the repo: the file fails with transformers' "requires the following packages ... hf_dspark"
message when the package is missing.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData
from transformers.utils import logging

from ..model.heads import get_head

logger = logging.get_logger(__name__)

REMOTE_CODE_FILE = "hf_dspark_auto.py"
AUTO_MAP = {"AutoConfig": "hf_dspark_auto.DSparkConfig", "AutoModel": "hf_dspark_auto.DSparkDrafter"}
TEMPLATE_NAME = "dspark_drafter_card.md"  # a Jinja template shipped as package data in hf_dspark/templates/
CARD_TAGS = ["dspark", "speculative-decoding", "draft-model", "hf-dspark"]

_REMOTE_CODE = '''"""Remote-code entry point for transformers' auto classes (written by hf-dspark).

The DSpark drafter is implemented in the hf-dspark package (`pip install hf-dspark`); this file only subclasses its
classes so that `AutoModel.from_pretrained(<this repo>, trust_remote_code=True)` works. Nothing else runs here.
"""

from hf_dspark import DSparkConfig as _DSparkConfig
from hf_dspark import DSparkDrafter as _DSparkDrafter


class DSparkConfig(_DSparkConfig):
    """hf_dspark.DSparkConfig."""


class DSparkDrafter(_DSparkDrafter):
    """hf_dspark.DSparkDrafter; bind it to its target with `drafter.bind_target(target)`."""

    config_class = DSparkConfig
'''


def add_remote_code(out_dir: str | Path) -> None:
    """Write `hf_dspark_auto.py` and set `auto_map` in the folder's config.json."""
    out = Path(out_dir)
    config_file = out / "config.json"
    raw = json.loads(config_file.read_text())
    raw["auto_map"] = dict(AUTO_MAP)
    config_file.write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    (out / REMOTE_CODE_FILE).write_text(_REMOTE_CODE)


def _tau_table(tau: dict[str, Any] | None) -> str:
    """Markdown table from {"set": τ} or {"set": {"column": τ}}."""
    if not tau:
        return "_Not measured yet._"
    rows = {name: value if isinstance(value, dict) else {"τ": value} for name, value in tau.items()}
    columns = list(dict.fromkeys(col for value in rows.values() for col in value))
    lines = ["| eval set | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for name, value in rows.items():
        cells = [f"{v:.2f}" if isinstance(v := value.get(c, ""), int | float) else str(v) for c in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _architecture(config) -> str:
    head = get_head(config.head_type).card.format(rank=config.markov_rank)
    convention = "anchor-first (DSpark)" if config.sample_from_anchor else "anchor + γ masks (DFlash)"
    return "\n".join([
        f"- {config.num_hidden_layers} drafter layers shaped like the target's (`{config.target_model_type}`: hidden "
        f"{config.hidden_size}, {config.num_attention_heads} heads / {config.num_key_value_heads} KV heads)",
        f"- context from target layers {config.target_layer_ids} of {config.num_target_layers} (KV injection)",
        f"- {head}; confidence head: {'yes' if config.use_confidence_head else 'no'}",
        f"- block convention: {convention}, γ = {config.block_size}, mask token id {config.mask_token_id}",
        "- shares the target's embedding and LM head (not stored here)"
        + (f"; drafts over a draft vocabulary of {config.draft_vocab_size:,} tokens (`d2t` / `t2d` in the weights)"
           if getattr(config, "draft_vocab_size", None) else ""),
    ])


def _usage(base_model: str, repo_id: str) -> str:
    return f'''```python
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_dspark import DSparkDrafter  # pip install hf-dspark

tokenizer = AutoTokenizer.from_pretrained("{base_model}")
target = AutoModelForCausalLM.from_pretrained("{base_model}", dtype=torch.bfloat16)
drafter = DSparkDrafter.from_pretrained("{repo_id}", target=target)  # binds the target's embedding / LM head

inputs = tokenizer("Explain speculative decoding in one paragraph.", return_tensors="pt")
output = target.generate(**inputs, assistant_model=drafter, max_new_tokens=256)
print(tokenizer.decode(output[0], skip_special_tokens=True))
```

With hf-dspark installed, `AutoModel.from_pretrained("{repo_id}", trust_remote_code=True)` also loads it (the
repo's `hf_dspark_auto.py` only imports the package); bind it with `drafter.bind_target(target)`. For vLLM,
SGLang, speculators or DeepSpec, convert it with `hf-dspark export --engine vllm --drafter {repo_id} OUT` (or
`--engine sglang|speculators|deepspec`).'''


def card_data(base_model: str, license: str, datasets: list[str]) -> ModelCardData:
    """The card's YAML metadata: license, base model, library, tags and the Hub dataset ids among `datasets`."""
    hub_ids = [d for d in datasets if "/" in d and " " not in d]
    return ModelCardData(license=license, base_model=base_model, library_name="transformers", tags=list(CARD_TAGS),
                         datasets=hub_ids or None)


def card_template() -> str:
    """Text of the packaged model-card template (`hf_dspark/templates/dspark_drafter_card.md`)."""
    return resources.files("hf_dspark").joinpath("templates", TEMPLATE_NAME).read_text(encoding="utf-8")


def write_model_card(
    drafter,
    out_dir: str | Path,
    *,
    base_model: str | None = None,
    training_data: str | list[str] | None = None,
    budget: str | None = None,
    tau_table: dict[str, Any] | None = None,
    license: str = "apache-2.0",
    repo_id: str | None = None,
    title: str | None = None,
    template: str | Path | None = None,
    notes: str | None = None,
    reproduce: str | None = None,
    usage: str | None = None,
) -> Path:
    """Write README.md (a Hub model card, `huggingface_hub.ModelCard`) for a drafter folder.

    `training_data`: a description or a list of Hub dataset ids (also listed in the card metadata); `budget`: e.g.
    "3 GPU-hours on 1×H100, 20k steps"; `tau_table`: {"gsm8k": 3.4} or {"gsm8k": {"greedy": 3.4, "T=1": 3.1}};
    `notes`: markdown under the τ table (how it was measured); `reproduce`: markdown with the exact commands;
    `usage`: markdown replacing the default Hub usage snippet; `template`: a Jinja card template replacing the
    packaged one (same variables).
    """
    out = Path(out_dir)
    if template is not None and not Path(template).is_file():
        raise FileNotFoundError(f"Model card template {template} not found; omit template= to use the packaged one.")
    template_text = Path(template).read_text(encoding="utf-8") if template is not None else card_template()
    config = drafter.config
    bound = getattr(drafter, "_bound", None)
    base_model = base_model or (bound.name_or_path if bound else "") or (config.target_model_type or "unknown")
    repo_id = repo_id or out.name
    datasets = [training_data] if isinstance(training_data, str) else list(training_data or [])
    url = base_model if base_model.startswith(("http://", "https://")) else f"https://huggingface.co/{base_model}"
    card = ModelCard.from_template(
        card_data(base_model, license, datasets),
        template_str=template_text,
        title=title or f"DSpark drafter for {base_model}",
        base_model=base_model,
        base_model_url=url,
        gamma=config.block_size,
        architecture=_architecture(config),
        training_data=", ".join(datasets) if datasets else "_not recorded_",
        budget=budget or "_not recorded_",
        tau_table=_tau_table(tau_table),
        notes=notes or "",
        usage=usage or _usage(base_model, repo_id),
        reproduce=reproduce or "_not recorded_",
        license_text=f"`{license}`; the target model's own license also applies to its use.",
    )
    card.save(out / "README.md")
    return out / "README.md"


def save_for_hub(drafter, out_dir: str | Path, **card_facts: Any) -> Path:
    """`save_pretrained` + `hf_dspark_auto.py` + `auto_map` + README.md: a folder `push_to_hub` can publish as is."""
    out = Path(out_dir)
    drafter.save_pretrained(out)
    add_remote_code(out)
    write_model_card(drafter, out, **card_facts)
    logger.info(f"Wrote a Hub-ready drafter folder to {out}.")
    return out
