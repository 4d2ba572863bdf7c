"""Names as the ``fencepost`` commands print them: every character that does not print is escaped.

A name is printed so that two different names never look the same on a
terminal: a character that is not printable (``str.isprintable``: the
controls, format characters such as U+200B or U+202E, the separators other
than the space, private-use and unassigned code points) is written as
Python writes it in a string literal, ``\\x85``, ``\\u200b``,
``\\U000e0001``; and a backslash as ``\\\\``, so that the name ``a\\u200bb``
(eight characters) does not pass for ``a`` + U+200B + ``b``. A name made of
printable characters without a backslash, every name the coordinator accepts
today but those with a backslash or a no-break space, prints unchanged.
Names made before the coordinator refused Unicode's Cc, Cf, Zl and Zp
characters (:mod:`fencepost.client.v1.names`) can still be listed, and print
escaped. JSON output needs none of this: ``json.dumps`` escapes every
character outside ASCII.
"""

from __future__ import annotations

__all__ = ["shown_name"]


def _escape(char: str) -> str:
    if char == "\\":
        return "\\\\"
    if char.isprintable():
        return char
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def shown_name(name: str) -> str:
    """``name`` as a command prints it: non-printable characters and backslashes escaped.

    Args:
        name: A lock, semaphore or election name, or a name prefix.

    Returns:
        ``"a\\\\u200bb"`` (``a\\u200bb`` when printed) for ``"a\\u200bb"``;
        ``name`` itself when every character prints and none is a backslash.
    """
    if name.isprintable() and "\\" not in name:
        return name
    return "".join(_escape(char) for char in name)
