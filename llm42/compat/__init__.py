"""CPU-only compat for SGLang: a pure-torch ``sgl_kernel`` stand-in, a placeholder ``torchvision``.

Nothing here is active by itself (importing this package has no side effects). The subpackages
become the top-level names ``sgl_kernel`` / ``torchvision`` only through ``llm42_compat.pth``, which
appends this folder to ``sys.path`` after site-packages so real packages always win:

    python -m llm42.compat install-pth      # `make venv` runs this
    python -m llm42.compat status
"""
