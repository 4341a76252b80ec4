"""Keeps llm42's placeholder ``torchvision`` importable but invisible to availability probes.

``llm42_compat.pth`` appends ``llm42/compat`` to ``sys.path`` and then imports this module (a
top-level name because that folder is on the path). transformers decides "torchvision is available"
with ``importlib.util.find_spec("torchvision") is not None``; a placeholder found there would send
it down torchvision-backed image paths. So the finder for the compat folder answers ``None`` when
the lookup comes from ``importlib.util.find_spec`` and the spec when it comes from an ``import``
statement:

    importlib.util.find_spec("torchvision")   # None (as on a host without torchvision)
    import torchvision.transforms             # the placeholder

Only the compat folder's own finder is replaced, so a real torchvision anywhere earlier on
``sys.path`` is found first and untouched. Importing this module twice is harmless.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

COMPAT_DIR = os.path.dirname(os.path.abspath(__file__))
# Top-level names served from COMPAT_DIR only to real imports, never to probes.
HIDDEN_FROM_PROBES = frozenset({"torchvision"})

_PROBE_CODE = importlib.util.find_spec.__code__
_IMPORT_FRAME_NAME = "_find_and_load_unlocked"  # importlib._bootstrap, the `import` machinery
_MAX_FRAMES = 16


def _is_find_spec_probe() -> bool:
    """True when the innermost caller is ``importlib.util.find_spec`` rather than an import.

    Walks outwards and stops at whichever comes first: an ``import`` in progress (a probe of
    ``"torchvision.transforms"`` imports the parent for real, and that import must succeed) or
    ``importlib.util.find_spec`` itself.
    """
    frame = sys._getframe(2)
    for _ in range(_MAX_FRAMES):
        if frame is None:
            return False
        if frame.f_code is _PROBE_CODE:
            return True
        if frame.f_code.co_name == _IMPORT_FRAME_NAME:
            return False
        frame = frame.f_back
    return False


class CompatFileFinder(importlib.machinery.FileFinder):
    """The ordinary finder for COMPAT_DIR, minus probe visibility of HIDDEN_FROM_PROBES."""

    def find_spec(self, fullname, target=None):  # type: ignore[override]
        if fullname in HIDDEN_FROM_PROBES and _is_find_spec_probe():
            return None
        return super().find_spec(fullname, target)


def _path_hook(path: str) -> CompatFileFinder:
    if os.path.abspath(path) != COMPAT_DIR:
        raise ImportError("not llm42's compat folder")  # let the next hook handle it
    return _new_finder()


def _new_finder() -> CompatFileFinder:
    m = importlib.machinery
    return CompatFileFinder(  # the same loaders, in the same order, as CPython's default hook
        COMPAT_DIR,
        (m.ExtensionFileLoader, m.EXTENSION_SUFFIXES),
        (m.SourceFileLoader, m.SOURCE_SUFFIXES),
        (m.SourcelessFileLoader, m.BYTECODE_SUFFIXES),
    )


def install() -> None:
    # 1. The hook recreates the guarded finder if sys.path_importer_cache is ever cleared.
    if not any(getattr(hook, "__qualname__", "") == "_path_hook" and
               getattr(hook, "__module__", "") == __name__ for hook in sys.path_hooks):
        sys.path_hooks.insert(0, _path_hook)
    # 2. Replace the plain FileFinder already cached for the folder (it found this module).
    for entry in list(sys.path_importer_cache):
        if isinstance(entry, str) and os.path.abspath(entry) == COMPAT_DIR:
            sys.path_importer_cache[entry] = _new_finder()


install()
