"""``--adapter sglang-system``: the scheduler adapter for the SGLang release installed here."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from kvledger.contracts.adapters.protocol import Unsupported
from kvledger.contracts.adapters.sglang.cpu_import import base_release
from kvledger.contracts.adapters.system import COMPONENT_RELEASES, EARLY_COMPONENT_RELEASES, SystemAdapter, SystemConfig

MIXINS = ("0.5.9", "0.5.10", "0.5.11", "0.5.12")
"""Releases whose scheduler is assembled from mixins (``scheduler.py``)."""
EARLY_COMPONENTS = EARLY_COMPONENT_RELEASES
"""The releases whose scheduler is assembled from components over the first unified cache
(``scheduler_components_early.py``)."""
COMPONENTS = COMPONENT_RELEASES
"""Releases whose scheduler is assembled from components over a cache on a tree core (``scheduler_components.py``)."""


def installed_system_factory(config: SystemConfig) -> SystemAdapter:
    """The real scheduler of the installed SGLang, for ``config``; an untested release is refused by name."""
    return _installed(config, chunked=False)


def installed_chunked_factory(config: SystemConfig) -> SystemAdapter:
    """``--adapter sglang-system-chunked``: :func:`installed_system_factory` with SGLang's chunked prefill on."""
    return _installed(config, chunked=True)


def _installed(config: SystemConfig, chunked: bool) -> SystemAdapter:
    try:
        release = version("sglang")
    except PackageNotFoundError as err:
        raise ValueError("sglang-system: SGLang is not installed (build a venv with .ci/sglang_env)") from err
    release = base_release(release)  # NOTE: a post release is driven as the release it patches
    if release in MIXINS:
        from kvledger.contracts.adapters.sglang.scheduler import chunked_scheduler_factory, scheduler_factory

        return chunked_scheduler_factory(config) if chunked else scheduler_factory(config)
    if release in EARLY_COMPONENTS:
        from kvledger.contracts.adapters.sglang.scheduler_components_early import (
            early_chunked_factory,
            early_components_factory,
        )

        return early_chunked_factory(config) if chunked else early_components_factory(config)
    if release in COMPONENTS:
        from kvledger.contracts.adapters.sglang.scheduler_components import (
            chunked_system_factory,
            scheduler_system_factory,
        )

        return chunked_system_factory(config) if chunked else scheduler_system_factory(config)
    driven = ", ".join(MIXINS + EARLY_COMPONENTS + COMPONENTS)
    raise Unsupported(f"sglang-system: SGLang {release} is not a driven release (driven: {driven})")
