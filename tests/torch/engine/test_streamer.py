"""``generate(..., streamer=...)`` (transformers' calling conventions): a transformers
streamer gets the prompt's target ids, then each round's new ids, then ``end()``, as
``target.generate`` feeds it; its text is the output's text; one prompt only."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import TextIteratorStreamer, TextStreamer  # noqa: E402

from _torch_checks import counting_forwards  # noqa: E402
from hsd_torch import generate  # noqa: E402

torch.set_num_threads(1)
PROMPT = "def foo(x):\n"


class Recorder:
    """A streamer that records what it is given."""

    def __init__(self) -> None:
        self.puts: list[list[int]] = []
        self.ended = 0

    def put(self, value: Any) -> None:
        assert value.dim() == 2 and value.shape[0] == 1
        self.puts.append(value[0].tolist())

    def end(self) -> None:
        self.ended += 1


@pytest.mark.parametrize("method", ["ar", "tli", "slem"])
def test_the_streamer_gets_the_prompt_then_every_rounds_tokens(method: str, llama_uni: dict[str, Any]) -> None:
    rec = Recorder()
    out = generate(llama_uni["target"], llama_uni["drafter"], PROMPT, target_tokenizer=llama_uni["tt"], drafter_tokenizer=llama_uni["dt"],
                   method=method, max_new_tokens=12, seed=3, streamer=rec)
    assert rec.puts[0] == llama_uni["tt"](PROMPT)["input_ids"]  # the target's context, as transformers puts input_ids
    assert sum(rec.puts[1:], []) == out.sequences[0] and rec.ended == 1
    assert len(rec.puts) - 1 == out.stats[0].target_calls  # one put per round that emitted


def test_text_streamers_print_the_output_text(llama_uni: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    tok = llama_uni["tt"]
    it = TextIteratorStreamer(tok, skip_prompt=True)
    out = generate(llama_uni["target"], llama_uni["drafter"], PROMPT, target_tokenizer=tok, drafter_tokenizer=llama_uni["dt"],
                   method="slem", max_new_tokens=16, do_sample=False, streamer=it)
    assert "".join(it) == tok.decode(out.sequences[0])
    generate(llama_uni["target"], llama_uni["drafter"], PROMPT, target_tokenizer=tok, drafter_tokenizer=llama_uni["dt"],
             method="slem", max_new_tokens=16, do_sample=False, streamer=TextStreamer(tok, skip_prompt=True))
    assert capsys.readouterr().out == tok.decode(out.sequences[0]) + "\n"


def test_a_streamer_with_several_prompts_or_not_a_streamer_is_refused(llama_uni: dict[str, Any]) -> None:
    kw: dict[str, Any] = dict(target_tokenizer=llama_uni["tt"], method="ar", max_new_tokens=2)
    with counting_forwards(llama_uni["target"]) as forwards:
        with pytest.raises(ValueError, match="a streamer takes one sequence"):
            generate(llama_uni["target"], None, [PROMPT, "x"], streamer=Recorder(), **kw)
        with pytest.raises(TypeError, match="streamer must be None or a transformers streamer"):
            generate(llama_uni["target"], None, PROMPT, streamer=print, **kw)
    assert forwards[0] == 0
