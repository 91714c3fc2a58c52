"""SLRS: string-level rejection sampling (Timor et al. 2025, Algorithm 3), one or several tokens.

Glossary
    draft       a drafter token, sampled in the drafter's vocabulary (as in SLEM).
    lookahead   k, the number of drafter tokens drafted per round: at most ``min(k, budget)`` (no round
                drafts more drafter tokens than it can emit target tokens), fewer after drafter EOS.
    proposal    the first ``max_tokens`` candidates that SLEM's procedure reads off the drafted
                text (target ids; see :func:`~hsd_core.methods.slem.draft_candidates`); empty
                when the target cannot encode the text (the alphabets may differ): the round is
                then the target's own token.
    psi         Psi(s) = the exact probability that the procedure proposes the tuple s; psi_j is
                the law of the j-th proposed token given the first j-1 (and that there is a j-th;
                psi_1 is the law given that there is a proposal at all).
    accepted    proposed token t_j kept with probability min(1, p_j(t_j) / psi_j(t_j)).
    rejected / correction   the first proposal that fails; a token from norm(max(p_j - psi_j, 0))
                replaces it.
    bonus       a token from p after the last proposal, when every proposal is accepted.

The drafting procedure, exactly: the drafter's context is its encoding of (prompt + decoded
emitted ids), re-synced incrementally (``resync``, :mod:`.resync`); it drafts ``min(k, budget)``
tokens autoregressively from its own law (argmax when greedy),
stopping after its EOS; the drafted text is re-tokenized for the target after the target
context with SLEM's look-behind (:func:`~hsd_core.methods.slem.retokenize`), with the target EOS
appended when the drafter ended; the proposal is the first ``max_tokens`` of those ids (all of
them when ``max_tokens`` is None), and at most the remaining budget.

Psi is the law of exactly that procedure, computed by running the same drafting code under the
exact :class:`~hsd_core.rand.Enumerator`. The enumeration tree is the trie of drafter token
sequences: its nodes are the distinct drafter contexts, each evaluated once (``evaluations``),
against ``naive_evaluations`` for evaluating every complete draft path separately.

Which psi? "The drafter's probability of every token sequence that concatenates exactly to t" is
not the marginal of any drafting procedure here (it sums to more than one when target tokens are
prefixes of others); the engine finds it lossy (``hsd_core.variants``, ``docs/slrs.md``). The
lossless psi is "the probability of every draft whose re-tokenization starts with t", taken over
exactly the drafts the procedure makes.

The bounded procedure (``min_path_prob`` and/or ``proposal_map="longest_prefix"``;
``proofs/slrs_bounded.md``): after each drafted token, drafting also stops when the path's drafter
probability (the product of the drafted tokens' probabilities) is below ``min_path_prob``, and,
with the longest-prefix map, as soon as the first ``m`` proposed target tokens are *settled* by
the text drafted so far (:meth:`LongestPrefixMap.settled`: no continuation of the text can change
them). The proposal is read off the text drafted so far. Every drafter context evaluated then has
path probability >= ``min_path_prob``, so psi costs at most ``1 + (lookahead - 1) /
min_path_prob`` drafter evaluations, whatever the vocabulary. The stopping rule depends only on the
drafted path and its probabilities, so it can be run level by level (one batched drafter pass per
depth over the surviving prefixes).

Multi-token SLRS (``max_tokens`` > 1 or None) verifies t_2, t_3, ... against psi conditioned on
the proposed prefix: a joint proposal law with its conditionals is all that standard
speculative verification needs (``proofs/slrs_multi.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from ..laws import Law, Prob, normalized
from ..models import Model, checked
from ..rand import CostLimitError, Enumerator, Rand
from ..tokenizers import Tokenizer, Unencodable
from ..vocab import Vocabulary
from .base import (HeterogeneousMethod, RejectionVerifier, RoundOutcome, State, check_greedy, check_lookahead,
                   check_lookbehind, sample)
from .resync import Resync, as_resync
from .slem import draft_candidates, drafter_context, retokenize

Proposal = tuple[int, ...]

DEFAULT_MAX_PSI_CALLS = 200_000
"""Default bound on the drafter calls one psi enumeration may make (a few seconds of pure Python):
past it :meth:`SLRS.psi` raises :class:`~hsd_core.rand.CostLimitError` instead of hanging
(``SLRS(lookahead=10)`` would need minutes, ``lookahead=50`` forever)."""


PROPOSAL_MAPS = ("retokenize", "longest_prefix")
"""The proposal maps (drafted text -> target ids) SLRS offers: ``"retokenize"`` is SLEM's
re-tokenization in context with look-behind (the default, today's procedure); ``"longest_prefix"``
is the greedy longest match of the text against the target's token strings
(:class:`LongestPrefixMap`), which ignores the target context and needs no tokenizer call."""


class LongestPrefixMap:
    """Greedy longest match of a text against a vocabulary's token strings, and when it is settled.

    ``parse(text)``: repeatedly take the longest token string that prefixes the rest of the text
    (its lowest id when several ids share the string). Over the vocabulary's own alphabet the parse
    covers the text (every character is a token); a drafter's text may hold characters the
    target's vocabulary lacks (the alphabets may differ), and where no token starts the rest the
    text is *dead*: the parse stops there and nothing after is ever read. ``settled(text, m)``: the
    first ``m`` ids of ``parse(text + rest)`` are the same for every continuation ``rest``, i.e. for
    each of the first ``m`` tokens the text left before it is non-empty and is not a proper prefix of
    any token string (then no longer token can match there, whatever follows), or the text is dead
    before it. A text longer than the longest token is never a proper prefix.
    """

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab
        self.max_len = vocab.max_token_len
        self.proper_prefixes: frozenset[str] = frozenset(t[:i] for t in vocab.tokens for i in range(1, len(t)))

    def _longest(self, text: str, i: int) -> tuple[int, int] | None:
        """The longest token prefixing ``text[i:]`` (lowest id) and where it ends; None: dead there."""
        for j in range(min(len(text), i + self.max_len), i, -1):
            ids = self.vocab.ids_of(text[i:j])
            if ids:
                return ids[0], j
        return None

    def parse(self, text: str, limit: int | None = None) -> tuple[int, ...]:
        """The greedy longest-match ids of ``text`` (the first ``limit`` of them; up to where the
        text is dead)."""
        out: list[int] = []
        i = 0
        while i < len(text) and (limit is None or len(out) < limit):
            hit = self._longest(text, i)
            if hit is None:
                break
            out.append(hit[0])
            i = hit[1]
        return tuple(out)

    def settled(self, text: str, m: int) -> bool:
        """Whether no continuation of ``text`` changes the first ``m`` ids of its parse."""
        i = 0
        for _ in range(m):
            rest = text[i:]
            if not rest or rest in self.proper_prefixes:
                return False
            hit = self._longest(text, i)
            if hit is None:
                return True
            i = hit[1]
        return True


@dataclass(frozen=True)
class PsiLaw:
    """The exact law ``law`` of the proposal tuple, and what computing it cost in drafter calls."""

    law: dict[Proposal, Prob]
    evaluations: int
    naive_evaluations: int

    def conditional(self, prefix: Sequence[int], size: int) -> Law | None:
        """psi_j: law over ``size`` target ids of the next proposed token after ``prefix``, given
        that the proposal starts with ``prefix`` and goes on (``None`` if it never does)."""
        j = len(prefix)
        pre = tuple(prefix)
        zero: Prob = next(iter(self.law.values())) * 0
        w: list[Prob] = [zero] * size
        for s, pr in self.law.items():
            if len(s) > j and s[:j] == pre:
                w[s[j]] += pr
        return normalized(w)

    def first(self, size: int) -> Law:
        """psi of the first proposed token (the paper's psi(t))."""
        law = self.conditional((), size)
        assert law is not None
        return law


class _Counting:
    """A drafter proxy that records the distinct contexts it is asked about and the calls made on
    completed paths (a path that branches is re-run by the enumerator and not counted twice)."""

    def __init__(self, model: Model, max_calls: int | None = None) -> None:
        self.model = model
        self.contexts: set[tuple[int, ...]] = set()
        self.run_calls = 0
        self.total_calls = 0
        self.max_calls = max_calls

    @property
    def vocab(self) -> Vocabulary:
        return self.model.vocab

    @property
    def tokenizer(self) -> Tokenizer:
        return self.model.tokenizer

    def next_probs(self, context_ids: Sequence[int]) -> Law:
        self.total_calls += 1
        if self.max_calls is not None and self.total_calls > self.max_calls:
            raise CostLimitError(f"more than {self.max_calls} drafter calls")
        self.contexts.add(tuple(context_ids))
        self.run_calls += 1
        return self.model.next_probs(context_ids)


class SLRS(RejectionVerifier, HeterogeneousMethod):
    """String-level rejection sampling against the exact proposal law psi.

    ``max_tokens=1`` is the paper's algorithm (one verified proposal per round, plus the target's
    own next token when it is accepted); ``max_tokens=None`` verifies every candidate.

    Defaults: ``lookahead=2``, ``max_tokens=1``, ``greedy=False``, ``lookbehind=4``,
    ``max_psi_calls=200_000`` (the cost guard of :meth:`psi`; above it, ``CostLimitError``),
    ``min_path_prob=None``, ``proposal_map='retokenize'`` (these two give the procedure of the
    module docstring exactly), ``resync=Resync(stride=256, lookbehind=4)`` (the drafter's context, :mod:`.resync`).

    The bounded procedure: ``min_path_prob=tau`` (0 < tau <= 1, a Fraction or float) stops a draft
    path once its drafter probability is below ``tau``, so psi costs at most
    ``1 + (lookahead - 1) / tau`` drafter evaluations; ``proposal_map="longest_prefix"`` reads the
    proposal off the text by greedy longest match and stops drafting as soon as the proposal is
    settled. ``min_path_prob=None`` or ``0`` means no probability stop.
    """

    name = "SLRS"

    def __init__(self, lookahead: int = 2, max_tokens: int | None = 1, greedy: bool = False,
                 lookbehind: int = 4, max_psi_calls: int = DEFAULT_MAX_PSI_CALLS,
                 min_path_prob: Prob | float | None = None, proposal_map: str = "retokenize",
                 resync: Resync | None = Resync()) -> None:
        self.lookahead = check_lookahead(lookahead)
        self.resync = as_resync(resync)
        if min_path_prob is not None:
            if isinstance(min_path_prob, bool) or not isinstance(min_path_prob, (int, float, Fraction)) \
                    or not 0 <= min_path_prob <= 1:
                raise ValueError(f"min_path_prob must be None or a number in [0, 1], got {min_path_prob!r}")
            if min_path_prob == 0:
                min_path_prob = None
        self.min_path_prob: Prob | float | None = min_path_prob
        if proposal_map not in PROPOSAL_MAPS:
            raise ValueError(f"proposal_map must be one of {PROPOSAL_MAPS}, got {proposal_map!r}")
        self.proposal_map = proposal_map
        self._maps: dict[Vocabulary, LongestPrefixMap] = {}
        if isinstance(max_psi_calls, bool) or not isinstance(max_psi_calls, int) or max_psi_calls < 1:
            raise ValueError(f"max_psi_calls must be an integer >= 1, got {max_psi_calls!r}")
        self.max_psi_calls = max_psi_calls
        if max_tokens is not None:
            check_lookahead(max_tokens)
        self.max_tokens = max_tokens
        self.greedy = check_greedy(greedy)
        self.lookbehind = check_lookbehind(lookbehind)
        if max_tokens != 1:
            self.name = "SLRS-multi"
        self._psi_cache: dict[tuple[object, ...], PsiLaw] = {}
        self._models: dict[int, Model] = {}

    @property
    def bounded(self) -> bool:
        """Whether the procedure is the bounded one (a probability stop or the longest-prefix map)."""
        return self.min_path_prob is not None or self.proposal_map != "retokenize"

    def prefix_map(self, vocab: Vocabulary) -> LongestPrefixMap:
        """The longest-prefix map over ``vocab`` (built once per vocabulary)."""
        hit = self._maps.get(vocab)
        if hit is None:
            hit = self._maps[vocab] = LongestPrefixMap(vocab)
        return hit

    def propose(self, target: Model, drafter: Model, state: State, rand: Rand) -> Proposal:
        """One draw of the proposal tuple (the procedure in the module docstring)."""
        m = state.budget if self.max_tokens is None else min(self.max_tokens, state.budget)
        if not self.bounded:
            cands = draft_candidates(target, drafter, state, rand, min(self.lookahead, state.budget), self.greedy,
                                     self.lookbehind, resync=self.resync)
            return cands[:m]
        return self._propose_bounded(target, drafter, state, rand, m)

    def _extra_stop(self, rand: Rand) -> bool:
        """Hook for the lossy variant ``hsd_core.variants.SLRSCoinStop`` only: a further stop that
        psi does not account for. SLRS itself never stops here and draws nothing."""
        return False

    def _propose_bounded(self, target: Model, drafter: Model, state: State, rand: Rand, m: int) -> Proposal:
        """The bounded procedure: draft until the drafter's EOS, ``min(lookahead, budget)`` tokens, a path
        probability below ``min_path_prob``, or (longest-prefix map) a settled proposal; then read
        the first ``m`` target ids off the drafted text (target EOS appended after drafter EOS)."""
        d_ctx = drafter_context(target, drafter, state, self.resync)
        eos_d = drafter.vocab.eos_id
        longest = self.proposal_map == "longest_prefix"
        pmap = self.prefix_map(target.vocab) if longest else None
        tau = self.min_path_prob
        drafts: list[int] = []
        path: Prob | float = 1
        text = ""
        ended = False
        for _ in range(min(self.lookahead, state.budget)):
            q = drafter.next_probs(d_ctx + tuple(drafts))
            d = sample(q, rand, self.greedy)
            drafts.append(d)
            path = path * q[d]
            if d == eos_d:
                ended = True
                break
            text += drafter.vocab.string(d)
            if tau is not None and path < tau:
                break
            if pmap is not None and pmap.settled(text, m):
                break
            if self._extra_stop(rand):
                break
        if pmap is not None:
            cands = pmap.parse(text, m)
        else:
            try:
                cands = retokenize(target, state.target_context(target), text, self.lookbehind)
            except Unencodable:  # as SLEM's candidates: a text the target cannot encode proposes nothing
                return ()
        cands = cands + ((target.vocab.eos_id,) if ended else ())
        return cands[:m]

    def psi(self, target: Model, drafter: Model, state: State) -> PsiLaw:
        """The exact law of :meth:`propose` from ``state`` and its drafter-evaluation counts.

        Cached per (models, state, settings): a second call for the same state returns the same
        object without calling the drafter. Past ``max_psi_calls`` drafter calls it raises
        :class:`~hsd_core.rand.CostLimitError`."""
        target, drafter = checked(target, "target"), checked(drafter, "drafter")
        key = (id(target), id(drafter), state, self.lookahead, self.max_tokens, self.greedy, self.lookbehind,
               self.min_path_prob, self.proposal_map, self.resync)
        hit = self._psi_cache.get(key)
        if hit is not None and self._models.get(id(target)) is target and self._models.get(id(drafter)) is drafter:
            return hit
        counting = _Counting(drafter, self.max_psi_calls)
        naive = 0

        def run(rand: Rand) -> Proposal:
            nonlocal naive
            counting.run_calls = 0
            out = self.propose(target, counting, state, rand)
            naive += counting.run_calls
            return out

        try:
            law = Enumerator().law(run)
        except CostLimitError:
            raise CostLimitError(
                f"{self!r}: computing psi needs more than max_psi_calls={self.max_psi_calls} drafter calls "
                f"(lookahead={self.lookahead}); the enumeration grows about (drafter support)^lookahead. Lower "
                f"the lookahead (2-4 is typical), or pass SLRS(max_psi_calls=...) if you mean to wait") from None
        res = PsiLaw(law, len(counting.contexts), naive)
        if len(self._psi_cache) > 4096:
            self._psi_cache.clear()
            self._models.clear()
        self._models[id(target)], self._models[id(drafter)] = target, drafter
        self._psi_cache[key] = res
        return res

    def proposal_laws(self, target: Model, drafter: Model, state: State, proposal: Proposal) -> list[Law]:
        """psi_1, ..., psi_m: the law each proposed token was drawn from, given the ones before."""
        psi = self.psi(target, drafter, state)
        n = len(target.vocab)
        qs: list[Law] = []
        for j in range(len(proposal)):
            q = psi.conditional(proposal[:j], n)
            assert q is not None and q[proposal[j]] > 0, "a drawn proposal has positive psi"
            qs.append(q)
        return qs

    def step(self, target: Model, drafter: Model | None, state: State, rand: Rand) -> RoundOutcome:
        assert drafter is not None
        proposal = self.propose(target, drafter, state, rand)
        qs = self.proposal_laws(target, drafter, state, proposal)
        return self.verify(target, state.target_context(target), list(proposal), qs, rand, state.budget)
