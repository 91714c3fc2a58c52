"""Draws from an OpenAI-compatible completions endpoint, recorded in the samples format.

:func:`sample_endpoint` posts ``n`` requests to ``{base}/completions`` (vLLM's
``python -m vllm.entrypoints.openai.api_server``, SGLang, llama.cpp's server, ...), one draw per
request, each with its own ``seed``, the prompt as the target's ids (``prompt`` takes a list of ids
in the OpenAI API) and ``return_tokens_as_token_ids`` with ``logprobs`` so that the generated ids
come back as ids: a decoded string cannot be mapped back to ids (several id sequences decode to one
text). The ids are read from ``choices[0].token_ids`` where the server returns them, else from
``choices[0].logprobs.tokens`` written ``"token_id:N"``; a server that returns neither is refused
(:class:`EndpointError`) rather than guessed. The draws come back as a
:class:`~hsd_core.samples.SamplesFile` (and can be written with :func:`hsd_core.samples.write_samples`),
so the audit of a samples file runs on them unchanged.

Bounded: at most ``max_requests`` requests (``n`` must fit), each with a ``timeout`` in seconds,
and the whole run within ``time_budget`` seconds; loopback hosts only (``localhost``, 127.0.0.0/8,
``::1``) unless ``allow_remote=True``. Standard library only (``urllib``); no new dependency and no
torch, so an engine's own test suite can use it.
"""

from __future__ import annotations

import ipaddress
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .samples import Draw, Sampling, SamplesFile, format_draw, parse_samples

__all__ = ["EndpointError", "check_endpoint", "sample_endpoint"]


class EndpointError(ValueError):
    """The endpoint cannot be audited (not loopback, no ids, a timeout, a bad answer): one line."""


class _BudgetSpent(Exception):
    """The time budget ran out before or during a request (turned into an :class:`EndpointError`
    that says how many draws, ``done``, were made)."""

    done = 0


def _body(model: str, prompt_ids: list[int], seed: int, sampling: Sampling) -> dict[str, Any]:
    """The completions request of one draw: the prompt as ids, the seed, the ids asked back
    (``return_tokens_as_token_ids`` with ``logprobs``, and ``return_token_ids``), greedy as
    temperature 0, top-k / top-p only when set, and the other processing keys of the samples format that
    are set, under the same names (vLLM's OpenAI server reads them; ``bad_words_ids``: ``ValueError``)."""
    body: dict[str, Any] = {"model": model, "prompt": prompt_ids, "max_tokens": sampling.max_new_tokens, "n": 1,
                            "seed": seed, "logprobs": 1, "return_tokens_as_token_ids": True,
                            "return_token_ids": True, "stream": False}
    if sampling.do_sample:
        body["temperature"] = sampling.temperature
        if sampling.top_k is not None:
            body["top_k"] = sampling.top_k
        if sampling.top_p is not None:
            body["top_p"] = sampling.top_p
    else:
        body["temperature"] = 0.0
    extra = sampling.processing()
    extra.pop("order", None)  # which engine's order applies: the file's word, not a request setting
    if "bad_words_ids" in extra:
        raise ValueError("bad_words_ids cannot be sent: the OpenAI-compatible API takes bad words as text")
    if "min_p" in extra and not sampling.do_sample:
        extra.pop("min_p")
    body.update(extra)  # min_p, the penalties, logit_bias, allowed_token_ids, min_tokens, stop: vLLM's names
    return body


def _run_all(one: Callable[[int], Draw], n: int, concurrency: int) -> list[Draw]:
    """``[one(0), ..., one(n - 1)]``, with at most ``concurrency`` calls running at once, in index
    order whatever order they finish in. The first failure (in index order) is raised and the
    calls not yet started are cancelled; a :class:`_BudgetSpent` says how many calls had succeeded."""
    if concurrency <= 1:
        out = []
        for i in range(n):
            try:
                out.append(one(i))
            except _BudgetSpent as e:
                e.done = i
                raise
        return out
    with ThreadPoolExecutor(max_workers=int(concurrency)) as pool:
        futures = [pool.submit(one, i) for i in range(n)]
        try:
            return [f.result() for f in futures]
        except BaseException as e:
            for f in futures:
                f.cancel()
            if isinstance(e, _BudgetSpent):
                e.done = sum(1 for f in futures if f.done() and not f.cancelled() and f.exception() is None)
            raise


def check_endpoint(url: str, allow_remote: bool = False) -> str:
    """``url`` without a trailing slash, checked: http or https, a host, and a loopback host unless
    ``allow_remote``; :class:`EndpointError` otherwise."""
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise EndpointError(f"endpoint {url!r} is not an http(s) URL such as http://127.0.0.1:8000/v1")
    host = u.hostname
    loop = host == "localhost"
    if not loop:
        try:
            loop = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loop = False
    if not loop and not allow_remote:
        raise EndpointError(f"endpoint host {host!r} is not loopback (localhost, 127.0.0.1, ::1): hsd samples only local "
                            "servers unless told otherwise (allow_remote=True, --allow-remote)")
    return url.rstrip("/")


def _post(url: str, body: dict[str, Any], timeout: float) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read().decode("utf-8"))
    except urllib.error.HTTPError as e:
        detail = e.read().decode("utf-8", "replace")[:200]
        raise EndpointError(f"{url} answered HTTP {e.code}: {' '.join(detail.split())}") from None
    except (TimeoutError, OSError) as e:
        if isinstance(e, TimeoutError) or "timed out" in str(e):
            raise EndpointError(f"{url} did not answer within {timeout:g} s (timeout)") from None
        raise EndpointError(f"{url} cannot be reached: {getattr(e, 'reason', e)}") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise EndpointError(f"{url} answered something that is not JSON") from None


def _ids_of(ans: Any, url: str) -> tuple[list[int], str | None]:
    try:
        choice = ans["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise EndpointError(f"{url} answered without choices[0]: not an OpenAI completions answer") from None
    fr = choice.get("finish_reason")
    ids = choice.get("token_ids")
    if isinstance(ids, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        return list(ids), fr
    toks = (choice.get("logprobs") or {}).get("tokens")
    if isinstance(toks, list) and all(isinstance(t, str) and t.startswith("token_id:") for t in toks):
        try:
            return [int(t[len("token_id:"):]) for t in toks], fr
        except ValueError:
            pass
    raise EndpointError(f"{url} returned no token ids (neither choices[0].token_ids nor logprobs.tokens as "
                        "'token_id:N'): a server that cannot return ids (return_tokens_as_token_ids) cannot be audited")


def sample_endpoint(
    url: str,
    prompts: Sequence[str],
    prompt_ids: Sequence[Sequence[int]],
    seeds: Sequence[int],
    sampling: Sampling,
    *,
    model: str | None = None,
    allow_remote: bool = False,
    max_requests: int = 10_000,
    timeout: float = 60.0,
    time_budget: float = 3600.0,
    speculative: dict[str, Any] | None = None,
    engine: dict[str, str] | None = None,
    target: str | None = None,
    concurrency: int = 1,
) -> SamplesFile:
    """Draw one completion per seed from the OpenAI-compatible server at ``url`` (its ``/v1`` base):
    draw ``i`` conditions on ``prompt_ids[i % len(prompt_ids)]`` (recorded with the text
    ``prompts[i % len(prompts)]``) with seed ``seeds[i]`` and ``sampling`` (greedy: temperature 0;
    top-k / top-p sent when set; ``max_tokens`` the budget). ``model``: the served model's name
    (default: the first of ``GET {url}/models``). Returns the draws as a
    :class:`~hsd_core.samples.SamplesFile` whose ``engine`` says the endpoint (and ``speculative``
    is what the caller says the server runs: None for a server without speculation). Raises
    :class:`EndpointError` (one line) for a non-loopback host without ``allow_remote``, more seeds
    than ``max_requests``, a timeout, the time budget spent, or an answer without ids.

    ``concurrency``: how many requests are in flight at once (default 1: one after another). A
    server that batches requests (vLLM) draws much faster with more; each draw keeps its own seed
    and prompt, and the draws come back in seed order whatever order they finish in."""
    base = check_endpoint(url, allow_remote)
    if len(seeds) > max_requests:
        raise EndpointError(f"{len(seeds)} draws need {len(seeds)} requests, more than max_requests={max_requests}")
    if not prompts or len(prompts) != len(prompt_ids):
        raise ValueError("give one prompt text per prompt_ids entry (at least one)")
    if model is None:
        try:
            req = urllib.request.Request(base + "/models")
            with urllib.request.urlopen(req, timeout=timeout) as r:
                model = str(json.loads(r.read().decode("utf-8"))["data"][0]["id"])
        except (OSError, KeyError, IndexError, TypeError, ValueError) as e:
            raise EndpointError(f"{base}/models did not name a model ({' '.join(str(e).split())[:120]}): give the "
                                "model's name") from None
    start = time.monotonic()

    def one(i: int) -> Draw:
        left = time_budget - (time.monotonic() - start)
        if left <= 0:
            raise _BudgetSpent
        pid = [int(t) for t in prompt_ids[i % len(prompt_ids)]]
        try:
            ans = _post(base + "/completions", _body(str(model), pid, int(seeds[i]), sampling), min(timeout, left))
        except EndpointError as e:
            if left < timeout and str(e).endswith("(timeout)"):
                raise _BudgetSpent from None
            raise
        ids, fr = _ids_of(ans, base + "/completions")
        return Draw(ids=tuple(ids), seed=int(seeds[i]), prompt=prompts[i % len(prompts)], prompt_ids=tuple(pid),
                    finish_reason=fr)

    try:
        draws = _run_all(one, len(seeds), concurrency)
    except _BudgetSpent as e:
        raise EndpointError(f"the time budget of {time_budget:g} s ran out after {e.done} of {len(seeds)} draws") \
            from None
    eng = engine or {"name": f"openai-compatible endpoint {base}", "version": f"model {model}"}
    lines = [format_draw(d, engine=eng, sampling=sampling, speculative=speculative, target=target) for d in draws]
    return parse_samples(lines, f"<{base}>")
