"""A sequence's text as it grows, token by token: what may go out now, and where it stops.

Byte-level BPE can split one character over several tokens, so text ending in an incomplete
character is held back; text that could still become the start of a stop string is held back
too. What has gone out never changes afterwards, so the streamed pieces always add up to the
whole answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

_INCOMPLETE = "\ufffd"


class TextStream:
    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = ()) -> None:
        self.decode = decode
        self.stop = tuple(stop)
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = []
        self.text = ""
        self.sent = 0  # characters of self.text already handed out
        self.stopped = False  # a stop string appeared: text ends before it

    def add(self, token: int) -> None:
        self.ids.append(token)
        self.text = self.decode(self.ids)
        if self.stop:
            start = max(0, self.sent - self.hold)
            found = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
            if found:
                self.text = self.text[:min(found)]
                self.stopped = True

    def take(self, final: bool) -> str:
        """The text not handed out yet that is safe to hand out (all of it when final)."""
        end = len(self.text)
        if not final:
            end -= self.hold
            while end > self.sent and self.text[end - 1] == _INCOMPLETE:
                end -= 1
        piece = self.text[self.sent:end] if end > self.sent else ""
        self.sent += len(piece)
        return piece
