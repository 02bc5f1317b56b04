"""Weight files of drafter folders: safetensors only (never unpickled), with checks that name the file.

Every layout (native, DeepSpec / serving engine, z-lab DFlash) stores the drafter's tensors under the same names
(`fc.weight`, `layers.{i}.self_attn.q_proj.weight`, `markov_head.markov_w1.weight`, ...; no `model.` prefix), so
one set of checks serves them all: the tensors a drafter built from the folder's config expects must all be there
with the expected shapes, and nothing else may be (unknown tensors mean a model this package does not implement).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# Copies of the target's tensors that the engine layout carries; validated against the bound target, not kept.
SHARED_WEIGHTS = ("embed_tokens.weight", "lm_head.weight")


def weight_files(folder: str | Path) -> list[Path]:
    """The safetensors files holding a folder's weights; `ValueError` naming the folder when there are none.

    Pickle checkpoints (`pytorch_model.bin`, `.pt`, ...) are refused: loading them would run arbitrary code.
    """
    folder = Path(folder)
    if (folder / SINGLE_FILE).is_file():
        return [folder / SINGLE_FILE]
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError) as err:
            raise ValueError(f"{index} is not a valid safetensors index (needs a 'weight_map'): {err}") from err
        missing = [name for name in shards if not (folder / name).is_file()]
        if missing:
            raise ValueError(f"{index} lists shard(s) {missing} that are missing from {folder}.")
        return [folder / name for name in shards]
    found = sorted(folder.glob("*.safetensors"))
    if found:
        return found
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise ValueError(
            f"{folder} holds only pickle weights {pickles}; hf-dspark loads safetensors only and will not unpickle "
            "them (unpickling runs arbitrary code). Convert them to model.safetensors with a trusted tool first."
        )
    raise ValueError(f"{folder} has no weight file: expected {SINGLE_FILE} (or {INDEX_FILE} with its shards).")


def tensor_shapes(folder: str | Path) -> dict[str, tuple[tuple[int, ...], Path]]:
    """name -> (shape, file) for every tensor of the folder, read from the safetensors headers only."""
    shapes: dict[str, tuple[tuple[int, ...], Path]] = {}
    for file in weight_files(folder):
        try:
            with safe_open(file, framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118 (safe_open handles are not iterable)
                    shapes[name] = (tuple(handle.get_slice(name).get_shape()), file)
        except SafetensorError as err:
            raise unreadable(file, err) from err
    return shapes


def unreadable(file: Path, err: Exception) -> ValueError:
    """The error for a safetensors file that cannot be parsed (usually cut short by an interrupted copy or save)."""
    return ValueError(
        f"{file} ({file.stat().st_size:,} bytes) is not a readable safetensors file: {err}. It is probably truncated "
        "(an interrupted download, copy or save); re-download or re-save it."
    )


def read_tensors(folder: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of the folder (CPU), from its safetensors files, each in its own freshly allocated storage.

    The copy matters: tensors viewed at arbitrary offsets of the file buffer can take different (unaligned) kernel
    paths and differ from the saved model in the last bit.
    """
    tensors: dict[str, torch.Tensor] = {}
    for file in weight_files(folder):
        try:
            loaded = load_file(file, device="cpu")
        except SafetensorError as err:
            raise unreadable(file, err) from err
        tensors.update({name: t.clone() for name, t in loaded.items()})
    return tensors


def expected_shapes(drafter_cls: type, config) -> dict[str, tuple[int, ...]]:
    """name -> shape of every tensor a drafter built from `config` holds (built on the meta device: no memory)."""
    with torch.device("meta"):
        model = drafter_cls(config)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def check_tensor_names(
    found: dict[str, tuple[tuple[int, ...], Path]],
    expected: dict[str, tuple[int, ...]],
    config_file: Path,
    ignore: tuple[str, ...] = SHARED_WEIGHTS,
) -> None:
    """Raise `ValueError` naming the file(s) and the mismatch when the folder's tensors do not fit the config."""
    problems = []
    missing = sorted(set(expected) - set(found))
    if missing:
        files = sorted({str(f) for _, f in found.values()}) or ["(no tensors)"]
        problems.append(f"missing tensors {_few(missing)} (not in {', '.join(files)})")
    unexpected = sorted(set(found) - set(expected) - set(ignore))
    if unexpected:
        where = sorted({str(found[n][1]) for n in unexpected})
        problems.append(
            f"tensors this drafter does not have {_few(unexpected)} in {', '.join(where)} (a different model "
            "variant, e.g. DFlash2 convolutions, a reduced draft vocabulary or a head type hf-dspark lacks?)"
        )
    for name in sorted(set(found) & set(expected)):
        shape, file = found[name]
        if tuple(shape) != tuple(expected[name]):
            problems.append(
                f"{name} in {file} has shape {list(shape)}, {config_file.name} implies {list(expected[name])}"
            )
    if problems:
        raise ValueError(f"Checkpoint does not match {config_file}: " + "; ".join(problems[:6]) + ".")


def _few(names: list[str], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return f"[{shown}{', ...' if len(names) > limit else ''}] ({len(names)})"
