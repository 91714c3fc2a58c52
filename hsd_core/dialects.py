"""What the common servers say: the request of one draw and the ids of its answer, per server kind.

* :func:`request_settings` / :func:`request_body`: one draw's request for an OpenAI-compatible
  ``/completions`` API or llama.cpp's native ``/completion``; told the server's kind
  (:data:`SERVER_KINDS`), every stage the processing does not name is sent at its neutral value, so no
  server default acts unseen (:mod:`hsd_core.endpoint`, "Neutral values").
* :func:`ids_of`: the generated ids and finish reason in every shape the common servers answer with
  (:mod:`hsd_core.endpoint`, "Id shapes"); :func:`check_ids`: an answer that cannot be a draw (an id
  outside the vocabulary, more ids than ``max_tokens``) is an engine error naming the draw.

Pure functions over JSON-like values; standard library only.
"""

from __future__ import annotations

from typing import Any

from .samples import Sampling
from .transport import EndpointError

__all__ = ["APIS", "LLAMA_CPP_SAMPLERS", "SERVER_KINDS", "check_ids", "ids_of", "request_body", "request_settings"]

SERVER_KINDS = ("vllm", "llama.cpp", "sglang")
"""The servers whose neutral values :func:`request_settings` knows (``--server-kind``)."""
APIS = ("openai", "llama.cpp")
"""The request shapes :func:`~hsd_core.endpoint.sample_endpoint` speaks: the OpenAI ``/completions`` API under the
``/v1`` base, or llama.cpp's native ``/completion`` at the server's root."""
LLAMA_CPP_SAMPLERS = ("penalties", "top_k", "top_p", "min_p", "temperature")
"""The sampler chain hsd asks llama.cpp's server for (its ``samplers`` key): the stages
:mod:`hsd_core.processing` models, in its ``"llama.cpp"`` order (a logit bias is applied before the
chain, ``dist`` after it)."""

# Each kind's neutral value of every stage it has (the value that switches the stage off), under its names.
_NEUTRAL: dict[str, dict[str, Any]] = {
    "vllm": {"top_k": -1, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
             "frequency_penalty": 0.0},
    "sglang": {"top_k": -1, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
               "frequency_penalty": 0.0},
    # common/common.h, common_params_sampling: top-k 40, top-p 0.95, min-p 0.05, temperature 0.8, a penalty
    # window of 64, DRY, XTC, typical-p, top-n-sigma, mirostat, dynamic temperature, adaptive-p
    "llama.cpp": {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "top_n_sigma": -1.0, "xtc_probability": 0.0,
                  "dry_multiplier": 0.0, "mirostat": 0, "dynatemp_range": 0.0, "adaptive_target": -1.0, "min_keep": 0,
                  "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repeat_last_n": 0,
                  "samplers": list(LLAMA_CPP_SAMPLERS)},
}
# The samples format's name of a stage -> each kind's name (absent: the kind has no such stage).
_NAMES: dict[str, dict[str, str]] = {
    "vllm": {k: k for k in ("top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
                            "logit_bias", "allowed_token_ids", "min_tokens", "stop")},
    "sglang": {"top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "repetition_penalty": "repetition_penalty",
               "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
               "logit_bias": "logit_bias", "min_tokens": "min_tokens", "stop": "stop"},
    "llama.cpp": {"top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "repetition_penalty": "repeat_penalty",
                  "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
                  "penalty_last_n": "repeat_last_n", "logit_bias": "logit_bias", "stop": "stop"},
}


def request_settings(kind: str, sampling: Sampling, context: int) -> dict[str, Any]:
    """The processing keys of a request to a ``kind`` server (:data:`SERVER_KINDS`): every stage
    ``sampling`` sets, under the server's name, and **every other stage the server has at its
    neutral value**, so that no server default acts unseen (llama.cpp's top-k 40, top-p 0.95, min-p 0.05,
    penalty window 64, DRY, XTC, ...; vLLM's and SGLang's defaults from the model's generation
    config). Greedy: temperature 0 (top-k / top-p / min-p then neutral). ``context``: the longest
    prompt plus ``max_new_tokens``, llama.cpp's penalty window when ``sampling`` penalizes every id
    (``penalty_last_n`` None or -1; the server takes no -1). For llama.cpp the ``samplers`` chain is
    :data:`LLAMA_CPP_SAMPLERS`. A stage ``sampling`` sets that the server does not have (llama.cpp:
    allowed token ids, min_tokens; SGLang: allowed token ids; any: bad words as ids) raises
    ``ValueError`` naming it. ``order`` is not sent (it is the file's word on which order applies)."""
    if kind not in SERVER_KINDS:
        raise ValueError(f"unknown server kind {kind!r}; one of {', '.join(SERVER_KINDS)}")
    names = _NAMES[kind]
    out: dict[str, Any] = dict(_NEUTRAL[kind])
    out["temperature"] = float(sampling.temperature) if sampling.do_sample else 0.0
    named: dict[str, Any] = dict(sampling.processing())
    named.pop("order", None)
    if sampling.do_sample:
        if sampling.top_k is not None:
            named["top_k"] = sampling.top_k
        if sampling.top_p is not None:
            named["top_p"] = sampling.top_p
    else:
        named.pop("min_p", None)
    if "bad_words_ids" in named:
        raise ValueError("bad_words_ids cannot be sent: the servers' APIs take bad words as text")
    penalizes = any(named.get(k, off) != off for k, off in (("repetition_penalty", 1.0), ("presence_penalty", 0.0),
                                                             ("frequency_penalty", 0.0)))
    if kind == "llama.cpp":
        window = named.pop("penalty_last_n", None)
        if penalizes:
            named["penalty_last_n"] = int(context) if window is None or window < 0 else int(window)
    for key, value in named.items():
        if key not in names:
            raise ValueError(f"{key} is not a {kind} sampling parameter: such draws cannot be asked of this server")
        out[names[key]] = value
    return out


def request_body(model: str, prompt_ids: list[int], seed: int, sampling: Sampling, kind: str | None = None,
          context: int = 0, api: str = "openai") -> dict[str, Any]:
    """The request of one draw. ``api="openai"``: the completions request, the prompt as ids, the
    seed, the ids asked back (``return_tokens_as_token_ids`` with ``logprobs``, and
    ``return_token_ids``); ``api="llama.cpp"``: llama.cpp's native ``/completion`` request
    (``n_predict``, ``return_tokens``, no prompt cache). Without ``kind``: greedy as temperature 0,
    top-k / top-p only when set, and the other processing keys of the samples format that are set,
    under the same names (vLLM's OpenAI server reads them; ``bad_words_ids``: ``ValueError``); with
    ``kind``: :func:`request_settings` (every stage, the unnamed ones neutral)."""
    if api == "llama.cpp":
        body: dict[str, Any] = {"prompt": prompt_ids, "n_predict": sampling.max_new_tokens, "seed": seed,
                                "return_tokens": True, "cache_prompt": False, "stream": False}
        body.update(request_settings(kind or "llama.cpp", sampling, context))
        return body
    body = {"model": model, "prompt": prompt_ids, "max_tokens": sampling.max_new_tokens, "n": 1,
            "seed": seed, "logprobs": 1, "return_tokens_as_token_ids": True,
            "return_token_ids": True, "stream": False}
    if kind is not None:
        body.update(request_settings(kind, sampling, context))
        return body
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



def _int_list(x: Any) -> list[int] | None:
    if isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x):
        return list(x)
    return None


def _finish(x: Any) -> str | None:
    return x if isinstance(x, str) else None


def ids_of(ans: Any, url: str) -> tuple[list[int], str | None]:
    """The generated ids and the finish reason of one answer, in every shape the common servers use
    (:mod:`hsd_core.endpoint`, "Id shapes"); :class:`EndpointError` when none holds ids."""
    if isinstance(ans, dict) and "choices" not in ans:
        ids = _int_list(ans.get("tokens"))
        if ids is not None and isinstance(ans.get("stop_type"), str):  # llama.cpp's native /completion
            st = ans["stop_type"]
            return ids, "stop" if st in ("eos", "word") else "length" if st == "limit" else st
        ids = _int_list(ans.get("output_ids"))
        if ids is not None:  # SGLang's native /generate
            fr = (ans.get("meta_info") or {}).get("finish_reason") if isinstance(ans.get("meta_info"), dict) else None
            return ids, _finish(fr.get("type") if isinstance(fr, dict) else fr)
        raise EndpointError(f"{url} answered without choices[0] (and without llama.cpp's tokens with stop_type or "
                            "SGLang's output_ids): not a completions answer")
    try:
        choice = ans["choices"][0]
        fr = _finish(choice.get("finish_reason"))
    except (KeyError, IndexError, TypeError, AttributeError):
        raise EndpointError(f"{url} answered without choices[0]: not an OpenAI completions answer") from None
    ids = _int_list(choice.get("token_ids"))  # vLLM's and SGLang's return_token_ids
    if ids is not None:
        return ids, fr
    lp = choice.get("logprobs")
    toks = lp.get("tokens") if isinstance(lp, dict) else None
    if isinstance(toks, list) and all(isinstance(t, str) and t.startswith("token_id:") for t in toks):
        try:  # vLLM's return_tokens_as_token_ids
            return [int(t[len("token_id:"):]) for t in toks], fr
        except ValueError:
            pass
    content = lp.get("content") if isinstance(lp, dict) else None
    if isinstance(content, list) and all(isinstance(c, dict) for c in content):
        ids = _int_list([c.get("id") for c in content])  # llama.cpp's OpenAI answer: logprobs.content[i].id
        if ids is not None:
            return ids, fr
    raise EndpointError(f"{url} returned no token ids (neither choices[0].token_ids, logprobs.tokens as 'token_id:N' "
                        "nor logprobs.content[i].id): a server that cannot return ids cannot be audited")


def check_ids(ids: list[int], i: int, seed: int, max_tokens: int, vocab_size: int | None, url: str) -> None:
    """Refuse an answer that is not a draw of the target: more ids than asked, or an id that the
    target's vocabulary does not have (an engine error, named; never audited as a draw)."""
    if len(ids) > max_tokens:
        raise EndpointError(f"{url}: draw {i} (seed {seed}) returned {len(ids)} ids, more than max_tokens={max_tokens}: "
                            "an engine error, not a draw")
    for t in ids:
        if t < 0 or (vocab_size is not None and t >= vocab_size):
            size = "" if vocab_size is None else f" of {vocab_size} ids"
            raise EndpointError(f"{url}: draw {i} (seed {seed}) returned id {t}, outside the target's vocabulary{size}: "
                                "an engine error, not a draw")

