"""The SGLang adapter: hooks (declared in `patches/`) that translate SGLang's objects, call
`llm42.core` and apply what it returns. One module per scheduler phase:

  1. `hooks_prefill`: a deterministic prefill runs in any batch (batched prefill, the default)
     and a prompt pass (window -1, rows of W prompt tokens) later recomputes the prompt's KV and
     verifies o_0 like a candidate; a long prompt, one asking for prompt logprobs, or any with
     `--no-llm42-batched-prefill` prefills in a batch of its own, so o_0 depends on the request;
  2. `hooks_sampling`: decode steps append candidates on the shared fast path, seeded;
     `hooks_output` shows the detokenizer only the verified prefix, and `hooks_lifecycle`
     defers a finish (EOS, stop, length) until the tokens that caused it are verified;
  3. `hooks_verify`: before the scheduler builds its next batch, windows and prompts that are
     due are verified in fixed-shape passes (`verify_passes`, `verifier`) and the decisions of
     `llm42.core.verify_round` applied: commit, or truncate (`kv_rollback`) + corrected token;
  4. finished requests are released and streamed only after their last window is verified;
     `hooks_internal_state` carries the statistics to the tokenizer process (`endpoints`).

Per-request fields live in one object on the request (`request_state`).
"""
