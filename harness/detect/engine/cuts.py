"""A recipient's own canary cut short, where it reads as another tenant's.

A canary can be a proper prefix of another tenant's (the launch profile's home holds every other profile's:
`<home>` and `<home>/profiles/alpha`). A match of the whole longer one is that tenant's (`matcher._outermost`); but a
value an application cuts (a preview cut at N characters, a string truncated in a log) can end inside the longer
one, and what is left reads as the shorter one followed by a few more bytes. When the longer canary is the
recipient's own, such a hit is the recipient's value cut short, not the other tenant's: a hit of C (tenant V),
followed by a non-empty proper prefix of what the recipient's C' adds to C, then the end of the value (the end of
the buffer, a JSON string's closing quote, at any depth of escaping, or an ellipsis a preview adds). Anything else
after C stays V's: a byte that departs from C' (`<home>/profile.txt`), C' started and then more (`<home>/profil/x`),
or a longer canary of a third tenant. Only a plain hit is judged: what follows an encoded one is not its text.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

#: A JSON string's closing quote (escaped once per level of JSON inside a string: `"`, `\"`, `\\\"`, `\\\\\\\"`).
_QUOTES = tuple(b"\\" * (2**depth - 1) + b'"' for depth in range(4))
#: An ellipsis a preview adds where it cuts a value: three dots, U+2026 in UTF-8, or as a JSON escape.
_ELLIPSES = (b"...", "\u2026".encode(), b"\\u2026")


class _Canary(Protocol):
    @property
    def tenant(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def value(self) -> str: ...


class OwnCuts:
    """For each canary that another tenant's canary extends: that tenant and what its canary adds (bytes)."""

    def __init__(self, canaries: Iterable[_Canary]) -> None:
        ordered = sorted(canaries, key=lambda c: c.value)  # the values a value starts come right after it
        self.longer: dict[tuple[str, str], list[tuple[str, bytes]]] = {}
        for i, short in enumerate(ordered):
            j = i + 1
            while j < len(ordered) and ordered[j].value.startswith(short.value):
                long, j = ordered[j], j + 1
                if long.tenant != short.tenant and len(long.value) > len(short.value):
                    rest = long.value[len(short.value) :].encode()
                    self.longer.setdefault((short.tenant, short.kind), []).append((long.tenant, rest))

    def kept[M: tuple[_Canary, str, int, int]](self, found: list[M], data: bytes | bytearray | memoryview,
                                               recipient: str, reach: int) -> list[M]:
        """The matches (canary, encoding, start, end) of a whole buffer `data` but the plain ones that are
        `recipient`'s own canaries cut short (`reach`: bytes after a match that are looked at)."""
        return [m for m in found if m[1] != "plain" or not self.cut_short(
            bytes(data[m[3] : m[3] + reach]), (m[0].tenant, m[0].kind), recipient, True)]

    def cut_short(self, following: bytes, ident: tuple[str, str], recipient: str | None, ends: bool) -> bool:
        """Whether a plain hit of the canary `ident` (tenant, kind), `following` it the bytes up to the end of what
        was read (`ends`: that is the end of the value too), is the start of one of `recipient`'s own canaries
        cut short."""
        if recipient is None:
            return False
        for tenant, rest in self.longer.get(ident, ()):
            if tenant != recipient:
                continue
            n = 0
            while n < len(rest) and n < len(following) and following[n] == rest[n]:
                n += 1
            if 0 < n < len(rest) and _value_ends(following[n:], ends):
                return True
        return False


def _value_ends(after: bytes, ends: bool) -> bool:
    """Whether the value ends where `after` starts: nothing more was read and it ends there, a closing quote or an
    ellipsis."""
    if not after:
        return ends
    return after.startswith(_ELLIPSES) or any(after.startswith(q) for q in _QUOTES)
