"""What `DSparkDrafter` calls in the layers above it, passed in rather than imported.

`modeling_dspark` sits under `interop` (which loads drafters), `generation` (which routes `generate`) and the Hub
shim writer: `from_pretrained`, `save_pretrained`, `bind_target` and `last_generation_stats` reach them through
`HOOKS`, which the package (`hf_dspark/__init__.py`) fills on import. Importing `hf_dspark.model.modeling_dspark` always
runs that package `__init__` first, so the hooks are set before any drafter exists. A caller may replace one
(`HOOKS.enable_generate = my_router`), e.g. to bind without patching `generate`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any


@dataclass
class DrafterHooks:
    """Callables from the layers above `modeling_dspark`.

    Attributes:
        load_drafter: `(cls, source, *args, target=None, **kwargs) -> drafter` (`interop.loading.load_drafter`).
        add_remote_code: `(folder) -> None`, writes the Hub remote-code shim (`interop.hub.add_remote_code`).
        enable_generate: `(target) -> None`, routes `target.generate(assistant_model=drafter)` to DSpark
            (`generation.enable`).
        last_generation_stats: `(drafter) -> DSparkGenerationStats | None` (`generation.stats`).
    """

    load_drafter: Callable[..., Any] | None = None
    add_remote_code: Callable[[Any], None] | None = None
    enable_generate: Callable[[Any], None] | None = None
    last_generation_stats: Callable[[Any], Any] | None = None

    def get(self, name: str) -> Callable[..., Any]:
        """The hook `name`, or a RuntimeError naming it and the fix."""
        hook = getattr(self, name)
        if hook is None:
            raise RuntimeError(
                f"DSparkDrafter hook {name!r} is not set: import the package (`import hf_dspark`) rather than "
                f"loading hf_dspark/model/modeling_dspark.py on its own, or set hf_dspark.model.drafter_hooks.HOOKS.{name}."
            )
        return hook

    def names(self) -> list[str]:
        return [f.name for f in fields(self)]


HOOKS = DrafterHooks()
