"""Draws from an OpenAI-compatible completions endpoint, recorded in the samples format.

:func:`sample_endpoint` posts ``n`` requests to ``{base}/completions`` (vLLM's
``python -m vllm.entrypoints.openai.api_server``, SGLang, llama.cpp's server, ...), one draw per
request, each with its own ``seed``, the prompt as the target's ids (``prompt`` takes a list of ids
in the OpenAI API) and ``return_tokens_as_token_ids`` with ``logprobs`` so that the generated ids
come back as ids: a decoded string cannot be mapped back to ids (several id sequences decode to one
text). **Id shapes**: the ids are read from whichever of these the answer holds (a server that returns
none is refused, :class:`EndpointError`, rather than guessed):

* ``choices[0].token_ids`` (vLLM's and SGLang's ``return_token_ids``);
* ``choices[0].logprobs.tokens`` written ``"token_id:N"`` (vLLM's ``return_tokens_as_token_ids``);
* ``choices[0].logprobs.content[i].id`` (llama.cpp's server on ``/v1/completions``: its chat-logprobs
  shape; it ignores ``return_tokens_as_token_ids``);
* ``tokens`` with ``stop_type`` (llama.cpp's native ``/completion`` with ``return_tokens``; ``eos`` and
  ``word`` read as finish reason ``"stop"``, ``limit`` as ``"length"``);
* ``output_ids`` with ``meta_info.finish_reason.type`` (SGLang's native ``/generate``).

**Neutral values** (``server_kind``): a server applies its own defaults to every stage a request does
not name (llama.cpp: top-k 40, top-p 0.95, min-p 0.05, a repetition window, DRY, XTC, typical-p; vLLM
and SGLang: the model's generation config). Told the server's kind, the client sends the neutral value
of every stage the request's processing does not name (:func:`request_settings`) and records what it
sent in the samples file (``engine.server_kind``, ``engine.request``). The draws come back as a
:class:`~hsd_core.samples.SamplesFile` (and can be written with :func:`hsd_core.samples.write_samples`),
so the audit of a samples file runs on them unchanged.

**Bad answers are engine errors, never draws**: a negative id, an id outside the target's
vocabulary (``vocab_size``) or more ids than ``max_tokens`` is refused with one line naming the
draw (its index and seed) and the id and the vocabulary size, or the count and ``max_tokens``.

**No draw lost** (``out``): every draw is appended to the samples file ``out`` as it arrives
(:class:`~hsd_core.samples.SamplesAppender`: one whole line per ``write``, so the file is a valid
samples file at every moment) and stays there whatever ends the run (an error, the budget, Ctrl-C,
SIGKILL); a finished run rewrites the file in seed order, atomically. ``resume=True`` continues
such a file: the draws it holds (the same settings, seeds of this run, each with its own prompt)
are kept and only the missing seeds are requested, so a resumed run ends with the file that an
uninterrupted one writes.

**Deadlines**: each request ends within ``timeout`` seconds of wall-clock time whatever the server
sends (a watchdog shuts the socket at the deadline: a server that drips its answer a byte at a time
cannot hold a request), and the whole run within ``time_budget`` seconds, at every ``concurrency``.

**Transient faults** (HTTP 429, 500, 502, 503, 504; a connection reset or closed before a whole
answer) are retried up to ``retries`` times per draw with bounded exponential backoff (0.25 s,
doubling, at most 8 s; the server's ``Retry-After`` when it gives one, at most 8 s; never past the
run's deadline); the same request goes again (the same seed: the same draw). Every other 4xx says
the request is wrong and is never retried. Retries are counted (:class:`EndpointStats`).

**Bounded and local**: at most ``max_requests`` draws (``n`` must fit), answers of at most
:data:`MAX_ANSWER_BYTES`, at most ``concurrency`` requests in flight; loopback hosts only
(``localhost``, 127.0.0.0/8, ``::1``) unless ``allow_remote=True``; a redirect (3xx) is never
followed, to any host: it is refused with the place it points to. Standard library only
(``http.client``); no new dependency and no torch, so an engine's own test suite can use it.
"""

from __future__ import annotations

import json
import os
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .dialects import APIS, LLAMA_CPP_SAMPLERS, SERVER_KINDS, check_ids, ids_of, request_body, request_settings
from .samples import Draw, Sampling, SamplesAppender, SamplesFile, format_draw, parse_samples, recover_samples, \
    write_samples
from .transport import BACKOFF_FIRST, BACKOFF_MAX, MAX_ANSWER_BYTES, RETRY_STATUS, BudgetSpent, Caller, Connections, \
    EndpointError, EndpointStats, check_endpoint, run_all

__all__ = ["APIS", "BACKOFF_FIRST", "BACKOFF_MAX", "EndpointError", "EndpointStats", "LLAMA_CPP_SAMPLERS",
           "MAX_ANSWER_BYTES", "RETRY_STATUS", "SERVER_KINDS", "check_endpoint", "request_settings", "sample_endpoint"]


def _resume(out: str, lines_of: Callable[[Draw], str], seed_index: dict[int, int],
            prompt_of: Callable[[int], tuple[int, ...]]) -> dict[int, Draw]:
    """The draws of the interrupted run saved at ``out``, by index: refused (one line) when the file
    was written with other settings, or holds a seed this run does not draw or a draw with another
    prompt."""
    f = recover_samples(out)
    if f is None:
        return {}
    got: dict[int, Draw] = {}
    for d in f.draws:
        mine = json.loads(lines_of(d))
        theirs = json.loads(format_draw(d, engine=f.engine, sampling=f.sampling, speculative=f.speculative,
                                        target=f.target))
        for k in ("engine", "target", "speculative", "sampling"):
            if mine.get(k) != theirs.get(k):
                raise EndpointError(f"{out}: key {k!r} is {json.dumps(theirs.get(k))}, this run's is "
                                    f"{json.dumps(mine.get(k))}: resume only the run that wrote the file (or write "
                                    "to another file)")
        i = seed_index.get(d.seed) if d.seed is not None else None
        if i is None:
            raise EndpointError(f"{out}:{d.line}: seed {d.seed} is not one of this run's seeds: resume with the seed "
                                "and number of draws of the run that wrote the file")
        if d.prompt_ids != prompt_of(i):
            raise EndpointError(f"{out}:{d.line}: the draw of seed {d.seed} has other prompt ids than this run gives "
                                "it: resume with the prompts of the run that wrote the file")
        got[i] = d
    return got


def _checked_kind(api: str, server_kind: str | None) -> str | None:
    """The server kind an ``api`` implies (llama.cpp's native API: ``"llama.cpp"``), checked."""
    if api not in APIS:
        raise ValueError(f"unknown api {api!r}; one of {', '.join(APIS)}")
    if api == "llama.cpp":
        if server_kind not in (None, "llama.cpp"):
            raise ValueError(f"api 'llama.cpp' is llama.cpp's server, not server_kind {server_kind!r}")
        return "llama.cpp"
    return server_kind


def _check_run(prompts: Sequence[str], prompt_ids: Sequence[Sequence[int]], seeds: Sequence[int], max_requests: int,
               retries: int, out: str | None, resume: bool) -> None:
    """Refuse (one line) a run whose arguments cannot make the draws asked for."""
    if len(seeds) > max_requests:
        raise EndpointError(f"{len(seeds)} draws need {len(seeds)} requests, more than max_requests={max_requests}")
    if not prompts or len(prompts) != len(prompt_ids):
        raise ValueError("give one prompt text per prompt_ids entry (at least one)")
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
    if resume and out is None:
        raise ValueError("resume needs out (the samples file of the run to continue)")
    if len(set(int(s) for s in seeds)) != len(seeds):
        raise ValueError("the seeds must be distinct (a repeated seed is not an independent draw)")
    if out is not None and not resume and os.path.exists(out) and os.path.getsize(out) > 0:
        raise EndpointError(f"{out} exists: resume it (resume=True, --resume) or write to another file")


def _served_model(call: Caller, base: str, time_budget: float) -> str:
    """The first model ``GET {base}/models`` names (one line when it names none)."""
    try:
        return str(call(base + "/models", None)["data"][0]["id"])
    except BudgetSpent:
        raise EndpointError(f"the time budget of {time_budget:g} s ran out before {base}/models answered") from None
    except (KeyError, IndexError, TypeError) as e:
        raise EndpointError(f"{base}/models did not name a model ({' '.join(str(e).split())[:120]}): give the "
                            "model's name") from None


@dataclass
class _Run:
    """One endpoint run's fixed parts: where each draw is asked (``url``), how, and how it is recorded."""

    call: Caller
    url: str
    model: str
    prompts: Sequence[str]
    prompt_ids: Sequence[Sequence[int]]
    seeds: Sequence[int]
    sampling: Sampling
    engine: dict[str, Any]
    speculative: dict[str, Any] | None
    target: str | None
    server_kind: str | None
    api: str
    vocab_size: int | None
    extra_of: Callable[[Any], dict[str, Any]] | None

    @property
    def context(self) -> int:
        """The longest prompt plus the budget (llama.cpp's penalty window over every id)."""
        return max((len(p) for p in self.prompt_ids), default=0) + self.sampling.max_new_tokens

    def prompt_of(self, i: int) -> tuple[int, ...]:
        return tuple(int(t) for t in self.prompt_ids[i % len(self.prompt_ids)])

    def line(self, d: Draw) -> str:
        return format_draw(d, engine=self.engine, sampling=self.sampling, speculative=self.speculative,
                           target=self.target)

    def draw(self, i: int) -> Draw:
        """Draw ``i``: asked with its seed and prompt, its answer read and checked."""
        pid, seed = self.prompt_of(i), int(self.seeds[i])
        ans = self.call(self.url, request_body(self.model, list(pid), seed, self.sampling, self.server_kind,
                                               self.context, self.api))
        ids, fr = ids_of(ans, self.url)
        check_ids(ids, i, seed, self.sampling.max_new_tokens, self.vocab_size, self.url)
        return Draw(ids=tuple(ids), seed=seed, prompt=self.prompts[i % len(self.prompts)], prompt_ids=pid,
                    finish_reason=fr, extra={} if self.extra_of is None else dict(self.extra_of(ans)))

    def all(self, out: str | None, resume: bool, concurrency: int, conns: Connections, stats: EndpointStats,
            on_draw: Callable[[int], None] | None, time_budget: float) -> SamplesFile:
        """Every draw (the ones saved in ``out`` first when ``resume``), appended to ``out`` as they
        arrive; the file rewritten in seed order at the end."""
        draws: dict[int, Draw] = {}
        if out is not None and resume:
            draws = _resume(out, self.line, {int(s): i for i, s in enumerate(self.seeds)}, self.prompt_of)
            stats.resumed = len(draws)
            if on_draw is not None and draws:
                on_draw(len(draws))
        appender = None if out is None else SamplesAppender(out, engine=self.engine, sampling=self.sampling,
                                                            speculative=self.speculative, target=self.target)

        def keep(i: int, d: Draw) -> None:
            if appender is not None:
                appender.append(d)
            draws[i] = d
            if on_draw is not None:
                on_draw(1)

        n = len(self.seeds)
        saved = "" if out is None else f"; they are saved in {out} (resume: resume=True, --resume)"
        try:
            run_all(self.draw, [i for i in range(n) if i not in draws], concurrency, keep, conns)
        except BudgetSpent:
            raise EndpointError(f"the time budget of {time_budget:g} s ran out after {len(draws)} of {n} draws"
                                + (saved if draws else "")) from None
        except EndpointError as e:
            raise EndpointError(f"{e}" + (f" ({len(draws)} of {n} draws made{saved})" if draws and out else "")) \
                from None
        finally:
            if appender is not None:
                appender.close()
        ordered = [draws[i] for i in range(n)]
        if out is not None:
            return write_samples(out, ordered, engine=self.engine, sampling=self.sampling,
                                 speculative=self.speculative, target=self.target)
        return parse_samples([self.line(d) for d in ordered], f"endpoint {urllib.parse.urlsplit(self.url).netloc}")


def sample_endpoint(
    url: str, prompts: Sequence[str], prompt_ids: Sequence[Sequence[int]], seeds: Sequence[int], sampling: Sampling,
    *, model: str | None = None, allow_remote: bool = False, max_requests: int = 10_000, timeout: float = 60.0,
    time_budget: float = 3600.0, speculative: dict[str, Any] | None = None, engine: dict[str, str] | None = None,
    target: str | None = None, concurrency: int = 1, retries: int = 3, vocab_size: int | None = None,
    out: str | os.PathLike[str] | None = None, resume: bool = False, stats: EndpointStats | None = None,
    server_kind: str | None = None, api: str = "openai", extra_of: Callable[[Any], dict[str, Any]] | None = None,
    on_draw: Callable[[int], None] | None = None,
) -> SamplesFile:
    """Draw one completion per seed from the OpenAI-compatible server at ``url`` (its ``/v1`` base):
    draw ``i`` conditions on ``prompt_ids[i % len(prompt_ids)]`` (recorded with the text
    ``prompts[i % len(prompts)]``) with seed ``seeds[i]`` and ``sampling`` (greedy: temperature 0;
    top-k / top-p sent when set; ``max_tokens`` the budget). ``model``: the served model's name
    (default: the first of ``GET {url}/models``). Returns the draws, in seed order, as a
    :class:`~hsd_core.samples.SamplesFile` whose ``engine`` says the endpoint (and ``speculative``
    is what the caller says the server runs: None for a server without speculation). Raises
    :class:`EndpointError` (one line) for a non-loopback host without ``allow_remote``, more seeds
    than ``max_requests``, a request past ``timeout`` seconds (wall clock), the time budget spent, a
    fault still there after ``retries`` retries, a redirect, or an answer that is not a draw (no
    ids, an id outside ``vocab_size`` or negative, more ids than ``max_tokens``).

    ``concurrency``: how many requests are in flight at once (default 1: one after another). A
    server that batches requests (vLLM) draws much faster with more; each draw keeps its own seed
    and prompt, and the draws come back in seed order whatever order they finish in.
    ``out``: the samples file every draw is appended to as it arrives (module docstring; an
    existing file is refused unless ``resume``); ``resume``: continue the run saved in ``out``.
    ``stats``: an :class:`EndpointStats` to fill in (requests, retries, resumed draws).
    ``server_kind`` (:data:`SERVER_KINDS`): send every stage of that server, the ones ``sampling``
    does not name at their neutral values (:func:`request_settings`), and record what was sent in the
    file's ``engine`` object (``server_kind`` and ``request``: the processing keys of every request);
    None: only the stages ``sampling`` names (the server's defaults act on the others).
    ``api`` (:data:`APIS`): ``"openai"``, or ``"llama.cpp"`` for llama.cpp's native ``/completion``
    at the server's root (``url`` with or without its ``/v1``; ``server_kind`` then ``"llama.cpp"``).
    ``extra_of``: a function of an answer (its JSON) whose keys are kept with its draw (written on the
    draw's line, the draw's ``extra``), e.g. a server's draft counters. ``on_draw(k)``: called with
    the number of draws each time some arrive (the resumed ones first), e.g. a progress bar's
    ``update`` (:mod:`hsd_core.progress`)."""
    base = check_endpoint(url, allow_remote)
    server_kind = _checked_kind(api, server_kind)
    context = max((len(p) for p in prompt_ids), default=0) + sampling.max_new_tokens
    sent = None if server_kind is None else request_settings(server_kind, sampling, context)
    out_path = None if out is None else os.fspath(out)
    _check_run(prompts, prompt_ids, seeds, max_requests, retries, out_path, resume)
    st = stats if stats is not None else EndpointStats()
    conns = Connections()
    call = Caller(timeout, time.monotonic() + time_budget, retries, st, conns)
    if model is None:
        model = "llama.cpp server" if api == "llama.cpp" else _served_model(call, base, time_budget)
    eng: dict[str, Any] = dict(engine or {"name": f"openai-compatible endpoint {base}", "version": f"model {model}"})
    if sent is not None:
        eng.update(server_kind=server_kind, request=sent)
    where = base + "/completions" if api == "openai" else base.removesuffix("/v1") + "/completion"
    run = _Run(call, where, model, prompts, prompt_ids, seeds, sampling, eng, speculative, target, server_kind, api,
               vocab_size, extra_of)
    return run.all(out_path, resume, concurrency, conns, st, on_draw, time_budget)
