"""A non-editable install works: build the wheel, install it into a fresh venv, run it from outside the tree.

Offline and fast: the wheel is built without build isolation and installed with `--no-deps --no-index`; the
fresh venv sees the dependencies already installed here through a `.pth` line naming this interpreter's
site-packages (a `.pth`-added folder does not run its own `.pth` files, so the editable install of the source
tree stays invisible and `import hf_dspark` can only find the wheel's copy).
"""

from __future__ import annotations

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
print("package data ok:", package)
"""


def _run(command: list[str], cwd: Path, env: dict[str, str], timeout: int = 900) -> str:
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{command} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.mark.slow
def test_wheel_installs_and_runs_outside_the_source_tree(tmp_path):
    source = tmp_path / "source"  # build from a copy: no build/ or egg-info written into the working tree
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w",
          str(tmp_path / "dist"), str(source)], tmp_path, env)
    (wheel,) = (tmp_path / "dist").glob("hf_dspark-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("hf_dspark/py.typed", "hf_dspark/templates/dspark_drafter_card.md",
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
