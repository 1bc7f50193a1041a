"""Text <-> token ids for the OpenAI API on a byte-vocabulary decoder, and the chat template.

Tokenizer: byte-level. A prompt is its UTF-8 bytes, token id = byte value
(0-255), which is exactly builtin:tiny-decoder's 256-token vocabulary
(builtin_models.DEC_VOCAB); there are no special tokens, so no end-of-text
token either: a generation ends at `max_tokens` or a `stop` sequence.
Generated ids are decoded incrementally as UTF-8 (a character may span
tokens); bytes that are not valid UTF-8 become U+FFFD, as `bytes.decode(...,
"replace")` does. A model with a larger vocabulary is sampled over ids 0-255.

Chat template: one role-tagged line per message, then the assistant's tag
for the answer:

    system: You are terse.
    user: Hello
    assistant: 

(`{role}: {content}\\n` per message, then `assistant: `; content given as a
list of parts is the concatenation of its text parts.) The answer is
generated after the same `assistant: ` that renders it in the next turn's
history, so that turn's prompt carries the answer's token ids exactly as
generated and its KV blocks, cached by the generation, are reused.
"""
from __future__ import annotations

import codecs

BYTE_VOCAB = 256


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    return bytes(ids).decode("utf-8", "replace")


def message_text(content) -> str:
    """A message's content: a string, or OpenAI's list of parts (text parts joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("only text content parts are supported")
            out.append(part["text"])
        return "".join(out)
    raise ValueError("content must be a string or a list of text parts")


def chat_prompt(messages: list[dict]) -> str:
    lines = [f"{m['role']}: {message_text(m.get('content'))}\n" for m in messages]
    return "".join(lines) + "assistant: "


class TextAssembler:
    """Generated ids -> text deltas, honouring stop sequences.

    Text that could still turn out to be the start of a stop sequence is held
    back until it cannot (so a stream never shows a stop sequence, nor a piece
    of one); the stop sequence itself is never part of the text."""

    def __init__(self, stop: list[str]):
        self.stop = [s for s in stop if s]
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.text = ""          # decoded so far (the answer is text[:end] when stopped)
        self.sent = 0           # characters handed out
        self.stopped = False

    def push(self, token: int) -> str:
        """The text that is now safe to show; sets `stopped` when a stop sequence completed."""
        self.text += self._decoder.decode(bytes([token]))
        return self._delta(final=False)

    def flush(self) -> str:
        if not self.stopped:
            self.text += self._decoder.decode(b"", final=True)
        return self._delta(final=True)

    def _delta(self, final: bool) -> str:
        if self.stopped:
            return ""
        cut = None
        for s in self.stop:
            i = self.text.find(s, self.sent)   # held-back text starts at `sent`
            if i >= 0 and (cut is None or i < cut):
                cut = i
        if cut is not None:
            self.stopped = True
            self.text = self.text[:cut]
            end = cut
        elif final:
            end = len(self.text)
        else:
            hold = 0
            for s in self.stop:       # the longest tail that is a proper prefix of a stop sequence
                for k in range(min(len(s) - 1, len(self.text)), hold, -1):
                    if self.text.endswith(s[:k]):
                        hold = k
                        break
            end = len(self.text) - hold
        out = self.text[self.sent:end]
        self.sent = max(self.sent, end)
        return out
