"""The OpenAI API's text side: byte tokenizer, chat template, stop sequences in a stream,
sampling determinism, the --openai-model mapping."""
from __future__ import annotations

import numpy as np
import pytest

from mcp26.inference.generation import Sampler
from mcp26.inference.openai_api import parse_model_map
from mcp26.inference.tokenizer import TextAssembler, chat_prompt, decode, encode


def feed(stop, text: str):
    a = TextAssembler(stop)
    deltas = []
    for t in encode(text):
        deltas.append(a.push(t))
        if a.stopped:
            break
    deltas.append(a.flush())
    return "".join(deltas), a.text, a.stopped, deltas


def test_byte_tokens_round_trip_and_split_characters_wait_for_their_last_byte():
    assert encode("hé") == [104, 195, 169] and decode(encode("hé €")) == "hé €"
    a = TextAssembler([])
    assert [a.push(t) for t in encode("é")] == ["", "é"]
    assert decode([255]) == "\ufffd"


def test_stop_sequence_ends_the_text_before_it_and_no_piece_of_it_is_streamed():
    streamed, text, stopped, deltas = feed(["END"], "abc EN dEND more")
    assert (streamed, text, stopped) == ("abc EN d", "abc EN d", True)
    assert deltas[4:7] == ["", "", "EN "]          # "E", "EN" held back until "EN " proved no stop
    assert feed(["xyz", "c E"], "abc EN dEND")[:3] == ("ab", "ab", True)     # the earliest stop wins
    assert feed(["zz"], "abz")[:3] == ("abz", "abz", False)           # a held-back prefix is flushed at the end


def test_chat_template_is_role_tagged_lines_then_the_assistant_tag():
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]}]
    assert chat_prompt(msgs) == "system: Be brief.\nuser: Hi!\nassistant: "


def test_sampling_is_greedy_at_temperature_zero_and_seeded_otherwise():
    logits = np.random.default_rng(1).standard_normal(256)
    assert Sampler(0, 1, None)(logits) == int(np.argmax(logits))
    def draws(seed, top_p=1.0):
        s = Sampler(1.0, top_p, seed)
        return [s(logits) for _ in range(20)]
    assert draws(7) == draws(7) and draws(7) != draws(8)
    top = set(np.argsort(-logits)[:1])
    assert set(draws(3, top_p=1e-9)) == top                            # the nucleus of one token


def test_openai_model_map():
    assert parse_model_map(["gpt-tiny=tiny-decoder:2", "x=tiny-decoder"]) == {
        "gpt-tiny": ("tiny-decoder", "2"), "x": ("tiny-decoder", "")}
    with pytest.raises(ValueError, match="NAME=MODEL"):
        parse_model_map(["nomodel"])
