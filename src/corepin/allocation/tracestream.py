"""Trace files read as a stream: one event at a time, in bounded memory.

`json.load` of a trace holds every event at once (a trace of 10^8 events is many GiB). This
reader takes the text in chunks (any iterable of strings: the CLI passes a file read 256 KiB at a
time; pure code never opens the file itself) and yields the events of
`{"events": [...]}` one by one, checked exactly as `parse_trace` checks them
(`corepin.allocation.simulate.iter_events`). It keeps the unread rest of the current chunk and
the live ids of the trace, nothing else.

The top level must be an object whose only key is "events" and whose value is a list, as for
`parse_trace`. Syntax errors are TraceError (exit 2) naming the line and column; one event may
be at most MAX_EVENT_CHARS characters of text.
"""

from __future__ import annotations

import json
import json.scanner
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

from corepin.allocation.simulate import TraceError, TraceEvent, iter_events

#: The longest text of a single event (a real one is under 200 characters).
MAX_EVENT_CHARS: Final = 1 << 20

_SPACE: Final = re.compile(r"[ \t\n\r]*")
#: The comma between two list items, with the white space around it; it must be followed by
#: more text (a comma at the very end of a chunk goes the slow way).
_SEPARATOR: Final = re.compile(r"[ \t\n\r]*,[ \t\n\r]*(?=.)", re.DOTALL)
_DECODER: Final = json.JSONDecoder()
#: The decoder's C scanner: `(value, end)` from `(text, index)`, raising StopIteration or
#: JSONDecodeError when no value starts there (what `raw_decode` calls, minus its wrapping).
_SCAN: Final[Callable[[str, int], tuple[Any, int]]] = json.scanner.make_scanner(
    _DECODER  # type: ignore[arg-type]  # typeshed declares make_scanner as a class
)


def stream_trace(chunks: Iterable[str]) -> Iterator[TraceEvent]:
    """The checked events of the trace whose text comes in `chunks`."""
    return iter_events(stream_raw_events(chunks))


def stream_raw_events(chunks: Iterable[str]) -> Iterator[Any]:
    """The JSON values of the "events" list of the trace whose text comes in `chunks`."""
    scan = _Scanner(chunks)
    scan.expect("{", 'a trace must be an object with an "events" list')
    key = scan.value()
    if not isinstance(key, str):
        raise scan.error('a trace must be an object with an "events" list')
    if key != "events":
        raise TraceError(None, key, 'unknown top-level field (only "events")')
    scan.expect(":", "expected ':' after \"events\"")
    if scan.peek() != "[":
        value = scan.value()
        raise TraceError(None, "events", f"events must be a list, got {type(value).__name__}")
    scan.take()
    if scan.peek() == "]":
        scan.take()
    else:
        yield from scan.items()
    if scan.peek() == ",":
        scan.take()
        key = scan.value()
        field = key if isinstance(key, str) else None
        raise TraceError(None, field, 'unknown top-level field (only "events")')
    scan.expect("}", "expected '}' after the events list")
    if scan.peek() != "":
        raise scan.error("extra data after the trace object")


class _Scanner:
    """A cursor over text that arrives in chunks; `buf[pos:]` is what is not read yet."""

    __slots__ = ("_chunks", "_eof", "_line", "_line_start", "buf", "pos")

    def __init__(self, chunks: Iterable[str]) -> None:
        self._chunks = iter(chunks)
        self._eof = False
        self.buf = ""
        self.pos = 0
        self._line = 1  # line number at buf[0]
        self._line_start = 0  # index in buf where that line starts (<= 0: in dropped text)

    def _more(self) -> bool:
        """Append the next chunk (dropping what was read); False at the end of the text."""
        if self._eof:
            return False
        for chunk in self._chunks:
            if chunk:
                break
        else:
            self._eof = True
            return False
        dropped = self.buf[: self.pos]
        newlines = dropped.count("\n")
        if newlines:
            self._line += newlines
            self._line_start = dropped.rindex("\n") + 1
        self._line_start -= self.pos
        self.buf = self.buf[self.pos :] + chunk
        self.pos = 0
        return True

    def peek(self) -> str:
        """The next character after white space ("" at the end of the text)."""
        while True:
            match = _SPACE.match(self.buf, self.pos)
            assert match is not None  # the pattern matches the empty string
            self.pos = match.end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._more():
                return ""

    def take(self) -> None:
        self.pos += 1

    def expect(self, char: str, problem: str) -> None:
        if self.peek() != char:
            raise self.error(problem)
        self.take()

    def value(self) -> Any:
        """The next JSON value."""
        if self.peek() == "":
            raise self.error("the text ends early (truncated?)")
        while True:
            try:
                value, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if len(self.buf) - self.pos < MAX_EVENT_CHARS and self._more():
                    continue  # the value may go on in the next chunk
                where = exc.pos
                if len(self.buf) - self.pos >= MAX_EVENT_CHARS:
                    raise self.error(
                        f"not valid JSON, or a value longer than {MAX_EVENT_CHARS} characters "
                        f"({exc.msg})"
                    ) from None
                raise self.error(f"not valid JSON: {exc.msg}", where) from None
            if end == len(self.buf) and self._more():
                continue  # a number or literal cut by the chunk boundary: read it whole
            self.pos = end
            return value

    def items(self) -> Iterator[Any]:
        """The values of a list up to its closing `]` (consumed); the cursor is at the first.

        The fast path decodes one value and matches the comma after it with one regex each;
        everything else (the end of a chunk, the end of the list, an error) takes the slow
        path through `value` and `peek`."""
        scan_once = _SCAN
        separator = _SEPARATOR.match
        while True:
            buf, pos = self.buf, self.pos
            try:
                value, end = scan_once(buf, pos)
            except (StopIteration, json.JSONDecodeError):
                value, end = self.value(), -1
            if end < 0 or end == len(buf):
                if end >= 0:
                    value = self.value()  # cut by the chunk boundary? read it whole
            else:
                match = separator(buf, end)
                if match is not None:
                    self.pos = match.end()
                    yield value
                    continue
                self.pos = end
            yield value
            if self.peek() == "]":
                self.take()
                return
            self.expect(",", "expected ',' or ']' after an event")
            self.peek()

    def error(self, problem: str, at: int | None = None) -> TraceError:
        at = self.pos if at is None else at
        line = self._line + self.buf.count("\n", 0, at)
        last = self.buf.rfind("\n", 0, at)
        column = at - (last + 1 if last >= 0 else self._line_start) + 1
        return TraceError(None, None, f"{problem} at line {line} column {column}")
