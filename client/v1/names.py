"""The characters a name may not contain, checked alike by the coordinator and both clients.

A name (a lock's, a semaphore's, an election's; a ListLocks prefix) is shown
to people: in ``fencepost locks``, ``status``, logs and metrics. So it may
not hold a character that is invisible or that changes how the text around
it is shown, by which two different names could look the same (``ab`` and
``a\\u200bb``) or a name could pass for another (``abc\\u202egpj.exe``).
Refused: every character of the Unicode general categories

- ``Cc``: the C0 controls (U+0000 to U+001F), DEL and the C1 controls
  (U+0080 to U+009F, such as U+0085 NEXT LINE);
- ``Cf``: format characters, such as U+200B ZERO WIDTH SPACE, U+200D ZERO
  WIDTH JOINER, U+FEFF, U+00AD SOFT HYPHEN and the bidirectional controls
  U+202A to U+202E and U+2066 to U+2069;
- ``Zl`` and ``Zp``: U+2028 LINE SEPARATOR and U+2029 PARAGRAPH SEPARATOR.

The categories are those of the Unicode database of the Python running the
check (:mod:`unicodedata`); the TypeScript client tests the same categories
with its regular expressions' ``\\p{...}`` classes. Elections' and
semaphores' internal lock names (:mod:`.kinds`) start with a C0 control, so
no caller's name can be one.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["FORBIDDEN_CATEGORIES", "forbidden_character", "forbidden_problem", "multilock_problem"]

#: The Unicode general categories no name may contain a character of.
FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})

#: The forbidden characters of ASCII (C0 and DEL): the only ones a name of ASCII can hold (one regex search).
_ASCII_CONTROL = re.compile("[\x00-\x1f\x7f]")


def forbidden_character(name: str) -> int | None:
    """The index of the first character of ``name`` in a forbidden category, if any.

    Args:
        name: A name (any length; a name of ASCII is checked by one regex search,
            others character by character, at most 256 bytes in a valid name).

    Returns:
        The index into ``name`` of the first character of category Cc, Cf, Zl
        or Zp; None when there is none.
    """
    found = _ASCII_CONTROL.search(name)
    if found is not None:
        return found.start()
    if name.isascii():
        return None
    for index, char in enumerate(name):
        if char >= "\x80" and unicodedata.category(char) in FORBIDDEN_CATEGORIES:
            return index
    return None


def forbidden_problem(name: str) -> str | None:
    """What is wrong with ``name``'s characters, worded to follow a field name; None when nothing is.

    Args:
        name: A name.

    Returns:
        ``"must not contain control characters (Unicode Cc), format characters
        (Cf) or line and paragraph separators (Zl, Zp): character 1 is U+200B
        (Cf)"``, or None.
    """
    index = forbidden_character(name)
    if index is None:
        return None
    char = name[index]
    return (f"must not contain control characters (Unicode Cc), format characters (Cf) or line and paragraph "
            f"separators (Zl, Zp): character {index} is U+{ord(char):04X} ({unicodedata.category(char)})")


def multilock_problem(names: list[str], most: int) -> str | None:
    """What is wrong with the list of names of a multi-lock, if anything: fewer than 2 or more than ``most``
    names, or a name given twice (each name is checked as a lock name besides)."""
    if not 2 <= len(names) <= most:
        return f"names has {len(names)} names; a multi-lock takes 2 to {most}"
    seen: set[str] = set()
    for name in names:
        if name in seen:
            return f"names has {name!r} more than once"
        seen.add(name)
    return None
