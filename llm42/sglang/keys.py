"""Names shared by the tokenizer process (`endpoints`) and the scheduler's hooks: torch-free, so
the tokenizer process does not import the scheduler side."""

# meta_info key -> DetRequestState counter, sent per request through SGLang's customized_info.
META_KEYS = {
    "llm42_verify_passes": "num_verify_passes",
    "llm42_rollbacks": "num_rollbacks",
    "llm42_tokens_rolled_back": "num_tokens_rolled_back",
    "llm42_restarts": "num_restarts",
}

# set_internal_state keys of llm42's endpoints (`hooks_internal_state.set_internal_state_hook`).
RESET_KEY = "llm42_reset_stats"
MODE_KEY = "llm42_benchmark_mode"
