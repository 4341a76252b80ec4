"""llm42: selective deterministic inference for SGLang (decode, verify, roll back)."""

__version__ = "0.1.0"
