"""Per-request verification-window state of one deterministic request (counters only).

The adapter owns the token list; this state owns the arithmetic that says which of those tokens
are verified, which window the next verification pass replays and when it is ready.

    state = DetRequestState(rid="r1", window_size=4, num_prompt_tokens=10)
    state.on_first_token(); state.append_candidates(4); assert state.is_ready

Output indices (W = 4, u = num_verified_tokens = 6, n = num_output_tokens = 11):

    index     0   1   2   3   4   5   6   7   8   9   10
              [ verified              )[ candidates            )      [0, u) and [u, n)
    window    k = (u - 1) // W = 1, candidates [kW+1, (k+1)W+1) = [5, 9), e = 9
    row       inputs o[kW, kW+num_real) = o[4, 8) at positions [P+4, P+8), prefix KV [0, P+4)
    compared  [u, min(n, e)) = [6, 9); entry j of the row predicts output index kW+1+j
    beyond    [e, n) = [9, 11): kept when the window is accepted, dropped on a rollback

Windows stay aligned to multiples of W, also after a rollback, so the verifier always sees the
same (prefix, row) split for the same request. Entries of the row before u (here index 5) are
re-run but never compared against the committed token; a difference there is only counted as
verifier inconsistency (``VerifyDecision.num_inconsistent``).

Prompt verification (``verify_prompt``): the prompt was prefilled on the fast path together with
other requests, so its KV and o_0 are candidates too. Until the prompt pass has run (u == 0), the
"window" is the prompt itself: ceil(P / W) rows of W prompt tokens (``planner.build_prompt_rows``)
whose last real entry predicts o_0; it behaves as window k = -1 with candidates [0, 1).
With ``prompt_verifies_next`` (inline verification) the prompt's rows end with one decode entry,
o_0 at position P, so the same pass also verifies o_1 when it exists: candidates [0, 2).
"""

from __future__ import annotations

from dataclasses import dataclass

from llm42.core.errors import InvariantError
from llm42.core.verify_decision import VerifyDecision


@dataclass(eq=False)
class DetRequestState:
    """Verification counters of one deterministic request; mutate only through the events.

    Invariants (checked after construction and after every event):
      * ``window_size >= 1`` and ``num_prompt_tokens >= 0``;
      * ``0 <= num_verified_tokens <= num_output_tokens``;
      * ``num_verified_tokens == 0`` exactly when ``num_output_tokens == 0`` (o_0 is verified
        as soon as it exists, it comes from the deterministic prefill), unless ``verify_prompt``;
      * a deferred finish exists only while candidates do (``num_verified_tokens <
        num_output_tokens``);
      * all per-request counters are >= 0 and ``num_rollbacks <= num_verify_passes``.
    """

    rid: str
    window_size: int
    num_prompt_tokens: int
    num_verified_tokens: int = 0
    num_output_tokens: int = 0
    num_verify_passes: int = 0
    num_rollbacks: int = 0
    num_tokens_rolled_back: int = 0
    num_restarts: int = 0
    # The finish (EOS, stop, length) the adapter withheld because unverified candidates caused
    # it; opaque here (SGLang's reason and length). Set only while candidates exist: released
    # by the decision that verifies the last one (`apply`), dropped by a rollback, abort or
    # restart, whose corrected or regenerated tokens decide the finish afresh.
    deferred_finish: object | None = None
    # Decode step at which the current verification job became ready (None: not ready, or not
    # stamped yet): how long it has waited for a pass to fill (`verify_round.due_jobs`).
    ready_since_step: int | None = None
    verify_prompt: bool = False  # prompt KV and o_0 come from the fast path: verify them first
    # Leading prompt tokens whose KV came from the prefix cache, written there by earlier prompt
    # passes (a multiple of W, below P): the prompt pass starts after them.
    num_cached_prompt_tokens: int = 0
    # The prompt pass also replays o_0 at position P and compares o_1 (``verify_prompt`` only).
    # Under inline verification a request's first decode step is launched before its prompt pass
    # (overlap loop), so o_1 would otherwise take a pass of its own before its chain can start.
    prompt_verifies_next: bool = False

    def __post_init__(self) -> None:
        self._check_invariants()

    # ------------------------------------------------------------------ derived quantities

    @property
    def num_candidate_tokens(self) -> int:
        """Unverified output tokens [u, n): never published, never prefix-cached."""
        return self.num_output_tokens - self.num_verified_tokens

    @property
    def is_finishing(self) -> bool:
        """A finish waits on the candidates: verify the partial window instead of waiting for W."""
        return self.deferred_finish is not None

    @property
    def is_prompt_pending(self) -> bool:
        """The prompt pass has not run yet: o_0 (when it exists) is a candidate."""
        return self.verify_prompt and self.num_verified_tokens == 0

    @property
    def window_index(self) -> int:
        """k = (u - 1) // W: the window holding the first unverified output index u (-1: prompt)."""
        if self.is_prompt_pending:
            return -1
        return max(self.num_verified_tokens - 1, 0) // self.window_size

    @property
    def window_start(self) -> int:
        """kW: output index of the row's first input token (the last token of window k-1)."""
        if self.is_prompt_pending:
            return -1  # the prompt pass predicts o_0 from its last entry, as entry 0 of "row -1"
        return self.window_index * self.window_size

    @property
    def window_end(self) -> int:
        """e = (k + 1)W + 1: exclusive end of window k's candidates, as an output index."""
        if self.is_prompt_pending:
            return 2 if self.prompt_verifies_next else 1
        return self.window_start + self.window_size + 1

    @property
    def compare_end(self) -> int:
        """min(n, e): exclusive end of the compared candidates [u, min(n, e))."""
        return min(self.num_output_tokens, self.window_end)

    @property
    def num_compare_tokens(self) -> int:
        """How many candidates the next pass compares (0 when there is nothing to verify)."""
        return max(self.compare_end - self.num_verified_tokens, 0)

    @property
    def is_ready(self) -> bool:
        """Window full (n >= e), a prompt with o_0 (whether or not o_1 exists yet), or finishing
        with at least one candidate (n > u)."""
        if self.num_output_tokens == 0:
            return False
        if self.is_prompt_pending or self.num_output_tokens >= self.window_end:
            return True
        return self.is_finishing and self.num_candidate_tokens > 0

    @property
    def num_real_entries(self) -> int:
        """min(n, e) - 1 - kW real row entries; the rest of the W entries are padding."""
        return max(self.compare_end - 1 - self.window_start, 0)

    @property
    def prefix_len(self) -> int:
        """P + kW: the row attends to the committed prefix KV [0, P + kW)."""
        return self.num_prompt_tokens + self.window_start

    @property
    def row_positions(self) -> list[int]:
        """Absolute positions [P + kW, P + kW + W) of all W row entries, padding included."""
        return list(range(self.prefix_len, self.prefix_len + self.window_size))

    # ------------------------------------------------------------------ events

    def on_first_token(self) -> None:
        """The prefill produced o_0: verified at once after a deterministic (solo) prefill, a
        candidate of the prompt pass after a fast-path one (``verify_prompt``)."""
        if self.num_output_tokens != 0:
            raise InvariantError(
                f"{self.rid}: on_first_token() expects no output yet, "
                f"found {self.num_output_tokens} output tokens"
            )
        self.num_output_tokens = 1
        self.num_verified_tokens = 0 if self.verify_prompt else 1
        self._check_invariants()

    def append_candidates(self, num_tokens: int = 1) -> None:
        """The fast (non-deterministic) decode path appended ``num_tokens`` candidates."""
        if num_tokens < 0:
            raise InvariantError(f"{self.rid}: cannot append {num_tokens} candidates")
        if self.num_output_tokens == 0:
            raise InvariantError(
                f"{self.rid}: append_candidates() before on_first_token(): o_0 must come "
                "from the deterministic prefill"
            )
        self.num_output_tokens += num_tokens
        self._check_invariants()

    def defer_finish(self, finish: object) -> None:
        """EOS / stop / max tokens seen on a candidate: withhold `finish` until it is verified."""
        if finish is None or self.num_candidate_tokens == 0:
            raise InvariantError(f"{self.rid}: a finish is deferred only while candidates exist")
        self.deferred_finish = finish
        self._check_invariants()

    def note_ready(self, step: int) -> None:
        """Stamp the decode step at which the current job was first seen ready (kept if set)."""
        if self.ready_since_step is None:
            self.ready_since_step = step

    def apply(self, decision: VerifyDecision) -> object | None:
        """Apply a verification result computed by ``decide()`` for this very state.

        Accept:   [0, u) verified + [u, min(n, e)) accepted      -> u' = min(n, e), n' = n
        Rollback: [0, u) + [u, m) accepted + corrected token at m -> u' = n' = m + 1
        A rollback also drops the deferred finish: the token that finished the request may be
        gone, so the adapter re-checks the finish condition on the corrected token. An accept
        that verifies the last candidate releases it: returned, for the adapter to finish the
        request with (None otherwise). Either way the job ran: its readiness stamp is cleared.
        """
        u, n = self.num_verified_tokens, self.num_output_tokens
        base_verified = decision.new_num_verified - decision.num_committed
        base_output = decision.new_num_output_tokens + decision.num_rejected
        if decision.is_rollback:
            base_output -= 1  # the corrected token replaced the mismatched one
        if (base_verified, base_output) != (u, n):
            raise InvariantError(
                f"{self.rid}: stale decision, computed for (verified={base_verified}, "
                f"output={base_output}) but the state is (verified={u}, output={n})"
            )
        self.num_verify_passes += 1
        if decision.is_rollback:
            self.num_rollbacks += 1
            self.num_tokens_rolled_back += decision.num_rejected
            self.deferred_finish = None
        self.num_verified_tokens = decision.new_num_verified
        self.num_output_tokens = decision.new_num_output_tokens
        self.ready_since_step = None
        released = None
        if self.deferred_finish is not None and self.num_candidate_tokens == 0:
            released, self.deferred_finish = self.deferred_finish, None
        self._check_invariants()
        return released

    def verify_on_arrival(self) -> object | None:
        """The one candidate, the last output token, was verified as it was made (an inline
        decode step, `--llm42-inline-verify`): it is committed without a pass. Returns the
        deferred finish it releases, if any (as ``apply`` does)."""
        if self.num_candidate_tokens != 1 or self.is_prompt_pending:
            raise InvariantError(
                f"{self.rid}: verify_on_arrival() needs exactly one candidate after the prompt, "
                f"found verified={self.num_verified_tokens}, output={self.num_output_tokens}"
            )
        self.num_verified_tokens = self.num_output_tokens
        self.ready_since_step = None
        released, self.deferred_finish = self.deferred_finish, None
        self._check_invariants()
        return released

    def verify_prompt_on_arrival(self) -> None:
        """o_0, the only output token, was sampled from the verifier's logits of a prompt whose
        KV the same forward made exact (`--llm42-inline-verify`: the prompt's rows ran inline with
        its prefill): prompt and o_0 are verified without a prompt pass."""
        if not self.is_prompt_pending or self.num_output_tokens != 1:
            raise InvariantError(
                f"{self.rid}: verify_prompt_on_arrival() needs a pending prompt and o_0 alone, "
                f"found verified={self.num_verified_tokens}, output={self.num_output_tokens}"
            )
        self.num_verified_tokens = 1
        self.ready_since_step = None
        self._check_invariants()

    def rollback_unverified(self) -> int:
        """Drop all candidates [u, n) (abort); return how many were dropped.

        Not counted as a rollback: no mismatch was seen, the candidates are simply discarded.
        """
        num_dropped = self.num_candidate_tokens
        self.num_output_tokens = self.num_verified_tokens
        self.deferred_finish = None
        self._check_invariants()
        return num_dropped

    def use_cached_prompt(self, num_tokens: int) -> None:
        """The prefill matched `num_tokens` prompt tokens of verified KV (``verify_prompt`` only):
        full prompt rows [0, num_tokens) are not replayed."""
        if num_tokens and not (self.verify_prompt and self.num_output_tokens == 0):
            raise InvariantError(f"{self.rid}: cached prompt KV only before a verified prefill")
        self.num_cached_prompt_tokens = num_tokens
        self._check_invariants()

    def restart(self) -> int:
        """Retraction: forget every output token, verified ones too; return how many were dropped.

        A re-prefill of prompt + outputs would rebuild the outputs' KV in one prefill instead of
        the verifier's windows (and the prompt's KV in a longer extend), so the rows verified
        later would see other prefix KV than in an unretracted run. Restarting from the prompt
        alone repeats the original solo prefill and every window exactly; the verified tokens
        come back bit for bit. Per-request counters keep counting across restarts.
        """
        num_dropped = self.num_output_tokens
        self.num_output_tokens = 0
        self.num_verified_tokens = 0
        self.deferred_finish = None
        self.ready_since_step = None
        self.num_restarts += 1
        self.num_cached_prompt_tokens = 0  # the next prefill matches the cache afresh
        self._check_invariants()
        return num_dropped

    # ------------------------------------------------------------------ invariants

    def _check_invariants(self) -> None:
        u, n = self.num_verified_tokens, self.num_output_tokens
        if self.window_size < 1:
            raise InvariantError(f"{self.rid}: window_size must be >= 1, found {self.window_size}")
        if self.num_prompt_tokens < 0:
            raise InvariantError(
                f"{self.rid}: num_prompt_tokens must be >= 0, found {self.num_prompt_tokens}"
            )
        if not 0 <= u <= n:
            raise InvariantError(f"{self.rid}: expected 0 <= verified <= output, found {u}, {n}")
        cached = self.num_cached_prompt_tokens
        if cached and (cached % self.window_size or cached >= self.num_prompt_tokens):
            raise InvariantError(
                f"{self.rid}: cached prompt tokens must be a multiple of W below P, found "
                f"{cached} with W={self.window_size}, P={self.num_prompt_tokens}"
            )
        if (u == 0) != (n == 0) and not self.verify_prompt:
            raise InvariantError(
                f"{self.rid}: o_0 is verified as soon as it exists, found verified={u}, output={n}"
            )
        if self.prompt_verifies_next and not self.verify_prompt:
            raise InvariantError(f"{self.rid}: only a verified prompt can verify o_1 with it")
        if self.deferred_finish is not None and u == n:
            raise InvariantError(f"{self.rid}: a deferred finish waits on candidates, found none")
        counters = (self.num_verify_passes, self.num_rollbacks, self.num_tokens_rolled_back,
                    self.num_restarts)
        if min(counters) < 0:
            raise InvariantError(
                f"{self.rid}: counters must be >= 0, found passes/rollbacks/rolled back/restarts {counters}"
            )
        if self.num_rollbacks > self.num_verify_passes:
            raise InvariantError(
                f"{self.rid}: each rollback comes from one verify pass, found "
                f"{self.num_rollbacks} rollbacks > {self.num_verify_passes} passes"
            )
