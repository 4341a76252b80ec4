"""llm42's placeholder ``torchvision`` for CPU-only hosts: imports succeed, use raises ImportError.

PyPI's torchvision does not load next to the CPU build of torch 2.13 (``operator torchvision::nms
does not exist``), yet ``sglang.srt.configs`` imports multimodal helpers that do
``import torchvision.transforms as T`` at module level. Text models never call them, so this package
lets those imports succeed and fails only when something is actually used:

    import torchvision.transforms as T     # fine
    T.Compose([])                          # ImportError: ... llm42's CPU placeholder ...

Importable as top-level ``torchvision`` only through ``llm42_compat.pth`` (after site-packages, so a
real torchvision wins). ``__version__`` is ``0.0.0`` so version gates (transformers'
``is_torchvision_greater_or_equal``) answer "too old" instead of crashing.
"""

from __future__ import annotations

import sys
import types
from typing import Any, NoReturn

__version__ = "0.0.0"
IS_LLM42_PLACEHOLDER = True

_HINT = (
    "is llm42's CPU placeholder for torchvision (llm42/compat/torchvision), not the real package: "
    "the PyPI torchvision wheel does not load next to CPU torch 2.13. Text models do not need it; "
    "for image/video models install a torchvision build matching your torch."
)

# Submodules SGLang 0.5.17 and transformers 5.12 import at module level (grep of their sources).
_SUBMODULES = (
    "io",
    "ops",
    "transforms",
    "transforms.functional",
    "transforms.v2",
    "transforms.v2.functional",
    "utils",
)


class _Unavailable:
    """A stand-in attribute: attribute chains resolve lazily, calling or subclassing raises."""

    __slots__ = ("_qualname",)

    def __init__(self, qualname: str) -> None:
        self._qualname = qualname

    def __getattr__(self, name: str) -> _Unavailable:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unavailable(f"{self._qualname}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ImportError(f"{self._qualname} {_HINT}")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> NoReturn:
        raise ImportError(f"cannot subclass {self._qualname}: it {_HINT}")

    def __iter__(self) -> NoReturn:
        raise ImportError(f"{self._qualname} {_HINT}")

    def __repr__(self) -> str:
        return f"<llm42 placeholder {self._qualname}>"


def _module_getattr(module_name: str):
    def __getattr__(name: str) -> _Unavailable:
        if name.startswith("__"):
            raise AttributeError(f"module {module_name!r} (llm42 placeholder) has no {name!r}")
        return _Unavailable(f"{module_name}.{name}")

    return __getattr__


def _install_submodules() -> None:
    # Registered in sys.modules (not files) so `import torchvision.transforms.v2.functional` works
    # without one stub file per submodule.
    for suffix in _SUBMODULES:
        full_name = f"{__name__}.{suffix}"
        if full_name in sys.modules:
            continue
        module = types.ModuleType(full_name, f"llm42 placeholder for {full_name}.")
        module.__getattr__ = _module_getattr(full_name)  # type: ignore[attr-defined]
        module.__path__ = []  # a package, so deeper placeholder submodules can hang below it
        sys.modules[full_name] = module
        parent_name, _, child = full_name.rpartition(".")
        setattr(sys.modules[parent_name], child, module)


__getattr__ = _module_getattr(__name__)
_install_submodules()
