"""Build fix for SGLang's NGRAM lookup table (C++ compiled at run time) on g++ 12 hosts.

``--speculative-algorithm NGRAM`` builds ``sglang/kernels/jit/csrc/ngram_corpus/*.cpp`` with
``load_jit("ngram_corpus", ...)`` when the worker starts. SGLang 0.5.17's sources use ``size_t``
in a header reached before any standard header that declares it, and g++ 12 (Debian 12's) stops
with ``'size_t' has not been declared``; the scheduler, and with it the server, dies. The
``around_on_cpu`` hook below force-includes ``<cstddef>`` for that one module. Neither SGLang nor
tvm-ffi reads compiler flags from the environment, so a hook on ``load_jit`` is the narrowest
place; other JIT modules are built unchanged.

    load_jit(original, "ngram_corpus", cpp_files=[...], header_only=False)   # + -include cstddef
"""

from __future__ import annotations

from typing import Any

NGRAM_MODULE = "ngram_corpus"
FORCED_INCLUDE = ("-include", "cstddef")


def load_jit(original, *args: str, **kwargs: Any):
    """AROUND ``sglang.kernels.jit.utils.compile.load_jit`` (CPU engine only)."""
    if args[:1] == (NGRAM_MODULE,):
        kwargs["extra_cflags"] = [*(kwargs.get("extra_cflags") or []), *FORCED_INCLUDE]
    return original(*args, **kwargs)
