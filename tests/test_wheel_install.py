"""A non-editable install works: build the wheel, install it into a fresh venv, run it from outside the tree.

Offline and fast: the wheel is built without build isolation and installed with `--no-deps --no-index`; the
fresh venv sees the dependencies already installed here through a `.pth` line naming this interpreter's
site-packages (a `.pth`-added folder does not run its own `.pth` files, so the editable install of the source
tree stays invisible and `import hf_dspark` can only find the wheel's copy).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CHECK_PACKAGE_DATA = """
import sys
from pathlib import Path

import hf_dspark
from hf_dspark.defaults import DEFAULT_DRAFTER_VARIANTS, default_drafter_dir
from hf_dspark.interop.hub import card_template
from hf_dspark.profiling.target_steps import SHIPPED_STEP_CURVES

package = Path(hf_dspark.__file__).parent
assert "site-packages" in str(package) and not str(package).startswith(sys.argv[1]), package
assert (package / "py.typed").is_file()
for variant in DEFAULT_DRAFTER_VARIANTS:
    folder = default_drafter_dir(variant)
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file(), folder
assert sorted(SHIPPED_STEP_CURVES.glob("x86_64--AVX2/*.json")), SHIPPED_STEP_CURVES
assert sorted(SHIPPED_STEP_CURVES.glob("x86_64--AVX512--bf16/*.json")), SHIPPED_STEP_CURVES
assert sorted(SHIPPED_STEP_CURVES.glob("x86_64--AVX512--bf16--amx/*.json")), SHIPPED_STEP_CURVES
assert "{{ card_data }}" in card_template()

import evaluate
from hf_dspark.eval.metrics import METRICS, metric_path
from hf_dspark.eval.prompts import PROMPT_SETS, load_prompt_set, shipped_prompt_set

for name in PROMPT_SETS:
    assert str(shipped_prompt_set(name)).startswith(str(package)) and load_prompt_set(name), name
assert (package / "resources" / "prompts" / "PROVENANCE.md").is_file()
for name in METRICS:
    assert str(metric_path(name)).startswith(str(package)), name
tau = evaluate.load(metric_path("accepted_length")).compute(verify_len=[4, 4], accepted=[3, 0], committed=[4, 1])
assert tau["tau"] == 2.5 and tau["tau_without_bonus"] == 1.5, tau
print("package data ok:", package)
"""

# Every command's defaults from a folder outside the checkout, with tiny settings (`{tmp}`: the test's folder).
TINY = ["--threads", "1", "--device", "cpu", "--dtype", "float32"]
COMMANDS = {
    "bench speed": ["bench", "speed", "--prompts", "1", "--max-new-tokens", "4", "--repeats", "1", "--block-sizes",
                    "--methods", "dspark", *TINY],
    "bench serve": ["bench", "serve", "--prompts-per-set", "1", "--concurrency", "1", "--policies", "none", "fixed",
                    "--requests", "1", "--max-new-tokens", "4", *TINY],
    "eval": ["eval", "--drafters", "d=untrained:2", "--limit", "1", "--max-new-tokens", "4", "--sweep",
             "--batch-size", "1", "--temperature", "0", "--threads", "1", "--device", "cpu"],
    "calibrate": ["calibrate", "--drafter", "{drafter}", "--out", "{tmp}/calibrated", "--limit", "4", "--mode",
                  "greedy", "--max-new-tokens", "32", "--batch-size", "4", "--threads", "1", "--device", "cpu"],
    "profile": ["profile", "--batch-tokens", "1", "2", "--repeats", "1", "--warmup", "0", "--cache-length", "8",
                "--threads", "1", "--device", "cpu"],
    "verify": ["verify", "--prompts", "1", "--max-new-tokens", "8", "--samples", "40", "--sample-batch", "40",
               "--sample-tokens", "2", "--min-position-samples", "10", "--quality-samples", "1",
               "--quality-max-new-tokens", "8", *TINY],
    "train": ["train", "--data", "{tmp}/conversations.jsonl", "--output_dir", "{tmp}/run", "--max_steps", "1",
              "--max_examples", "2", "--eval_strategy", "no", "--save_strategy", "no", "--report_to", "none",
              "--validation_fraction", "0", "--anchors_per_sequence", "4", "--num_threads", "1"],
}
EXPECTED = {"bench speed": "dspark", "bench serve": "serving with", "eval": "accepted length τ",
            "calibrate": "ECE", "profile": "", "verify": "losslessness certificate", "train": ""}
CONVERSATIONS = [{"turns": ["What is 2 + 3?"], "responses": ["2 + 3 = 5. The answer is \\boxed{5}."]},
                 {"turns": ["Name a colour."], "responses": ["Blue is a colour."]}]



def _run(command: list[str], cwd: Path, env: dict[str, str], timeout: int = 900, codes: tuple = (0,)) -> str:
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode in codes, f"{command} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout + result.stderr


@pytest.mark.slow
def test_wheel_installs_and_runs_outside_the_source_tree(tmp_path):
    source = tmp_path / "source"  # build from a copy: no build/ or egg-info written into the working tree
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["HF_DSPARK_CACHE"] = str(tmp_path / "cache")  # profile's default --out, work files: not the user's cache
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w",
          str(tmp_path / "dist"), str(source)], tmp_path, env)
    (wheel,) = (tmp_path / "dist").glob("hf_dspark-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("hf_dspark/py.typed", "hf_dspark/templates/dspark_drafter_card.md",
                   "hf_dspark/resources/prompts/gsm8k.jsonl", "hf_dspark/resources/prompts/PROVENANCE.md",
                   "hf_dspark/eval/metrics/accepted_length/accepted_length.py",
                   "hf_dspark/resources/drafters/smollm2-135m-instruct-dspark/model.safetensors",
                   "hf_dspark/resources/step_curves/x86_64--AVX2/SmolLM2-135M-Instruct__cpu__float32__t1.json"):
        assert needed in names, needed

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path,
                     env).strip())
    (site / "host_site_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)], tmp_path, env)

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    print(_run([str(python), "-c", CHECK_PACKAGE_DATA, str(ROOT)], outside, env))
    env["OMP_NUM_THREADS"] = "1"
    demo = _run([str(env_dir / "bin" / "hf-dspark"), "demo", "--max-new-tokens", "16", "--threads", "1",
                 "--device", "cpu", "--dtype", "float32"], outside, env)  # fp32: bit-identical to plain generate
    assert "Drafting with the default drafter: per round, the shipped default DSpark drafter or prompt lookup" in demo
    assert "identical output" in demo
    assert "'auto' drafted in" in demo and "held-out acceptance" in demo  # the demo explains what auto did

    (tmp_path / "conversations.jsonl").write_text("".join(json.dumps(c) + "\n" for c in CONVERSATIONS))
    drafter = _run([str(python), "-c", "from hf_dspark.defaults import default_drafter_dir as d; print(d())"],
                   outside, env).strip()
    for name, argv in COMMANDS.items():  # each command's defaults (prompt sets, outputs) from the outside folder
        argv = [part.format(tmp=tmp_path, drafter=drafter) for part in argv]
        codes = (0, 3) if name == "verify" else (0,)  # verify: 3 = inconclusive, likely with 8 tokens
        out = _run([str(env_dir / "bin" / "hf-dspark"), *argv], outside, env, codes=codes)
        assert EXPECTED[name] in out, f"{name}: {out[-2000:]}"
    assert sorted((outside / "benchmarks" / "results").glob("*/verify.json")), "verify wrote no report"
