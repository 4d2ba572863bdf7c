"""The access policy: which caller identities may take which actions on which lock names.

``fencepost serve --policy FILE`` reads a policy from a TOML (``.toml``) or
YAML (``.yaml``, ``.yml``) file. It lists rules; each allows some callers
some actions on some lock names, and whatever no rule allows is denied::

    # policy.toml
    [[allow]]
    identities = ["spiffe://example.org/billing", "worker.example"]
    actions = ["acquire", "release", "describe"]
    names = ["billing/*", "reports/daily"]

    [[allow]]
    identities = ["*"]             # every caller with a verified certificate
    actions = ["describe"]
    names = ["*"]                  # every lock name

The same in YAML: ``allow: [{identities: [...], actions: [...], names: [...]}]``.

A rule's keys, and nothing else:

- ``identities``: caller identities, matched exactly (case included): a
  client certificate's SPIFFE ID, else its first URI SAN, else its first
  DNS SAN, else its subject CN (:mod:`.identity`); ``"*"`` is any caller
  with a verified client certificate.
- ``anonymous``: ``true`` to also allow callers without a client
  certificate (none with ``--client-auth require``, the default; there is
  no identity string for them, so that no certificate can claim the name).
  A rule needs ``identities``, ``anonymous = true``, or both.
- ``actions``: ``acquire`` (Acquire, Withdraw), ``release`` (Release),
  ``describe`` (Describe, ListLocks), ``admin`` (ServerInfo, AdminRevoke,
  ListSessions: ``fencepost status`` and ``fencepost admin``).
- ``names``: lock names: an exact name, a prefix ending in ``*``
  (``billing/*`` is every name that starts with ``billing/``; ``job-*``
  those that start with ``job-``), or ``"*"`` for every name. ``*``
  elsewhere than at the end is refused.
- ``max_lock_delay_seconds`` (optional): the longest lock-delay the rule's
  Acquires may ask for, 0 to 3600 whole seconds; it lowers ``serve
  --max-lock-delay``, never raises it (:mod:`.lock_delay_limit`).

Every list must be non-empty, of strings; the file must hold at least one
rule. A bad file is refused with a :class:`PolicyError` naming the file,
the rule (``allow[2]``, counted from 0) and the key.

What each call needs (docs/security.md, "Access policy"): Acquire and
Withdraw ``acquire`` on the name; Release ``release``; Describe
``describe``; ListLocks lists only the locks the caller may ``describe``,
and is refused when no rule could allow it any name under the prefix;
ServerInfo ``admin`` on any name; AdminRevoke ``admin`` on the name and
ListSessions ``admin`` on ``"*"`` (every name), both refused without a
policy (see :mod:`..api.admin_calls`); LeaseGrant, LeaseRevoke and the KeepAlive
stream are not about one name: they need ``acquire`` on at least one name
(a lease is only good for acquiring; a caller that may only describe has
no use for one).

:meth:`Policy.allows` is a few dict lookups: the rules are folded, at load
time, into one table per (identity, action) of exact names and prefixes
(looked up by the prefix lengths that occur), with ``"*"``'s grants merged
into every named identity's.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fencepost.client.errors import AccessDenied
from fencepost.client.v1.keys import MAX_LOCK_DELAY_SECONDS, MAX_NAME_BYTES

from ..telemetry.events import log_event
from .identity import Caller, caller_of

__all__ = ["ACQUIRE", "ACTIONS", "ADMIN", "ANY_IDENTITY", "DESCRIBE", "RELEASE", "Access", "Policy", "PolicyError",
           "Rule", "require"]

_log = logging.getLogger(__name__)

ACQUIRE = "acquire"
RELEASE = "release"
DESCRIBE = "describe"
ADMIN = "admin"
#: Every action a rule may allow.
ACTIONS = (ACQUIRE, RELEASE, DESCRIBE, ADMIN)
#: In ``identities``: any caller with a verified client certificate.
ANY_IDENTITY = "*"
#: The keys a rule may have.
RULE_KEYS = ("identities", "anonymous", "actions", "names", "max_lock_delay_seconds")
#: The file name endings of each format.
FORMATS = {".toml": "toml", ".yaml": "yaml", ".yml": "yaml"}


class PolicyError(ValueError):
    """A policy file that cannot be used; the message names the file, the rule and the key.

    Attributes:
        source: the file (or ``"<text>"``).
        where: the rule and key at fault (``"allow[1].actions"``), or None for the file as a whole.
        problem: what is wrong.
    """

    def __init__(self, source: str, where: str | None, problem: str) -> None:
        self.source = source
        self.where = where
        self.problem = problem
        super().__init__(f"policy {source}: {where + ': ' if where else ''}{problem}")


@dataclass(frozen=True)
class Rule:
    """One ``[[allow]]`` rule, checked.

    Attributes:
        identities: the identities it names exactly (``"*"`` included as is).
        anonymous: whether it also allows callers without a client certificate.
        actions: the actions it allows (of :data:`ACTIONS`).
        names: its name patterns: exact names, prefixes ending in ``*``, or ``"*"``.
        max_lock_delay_seconds: the longest lock-delay its Acquires may ask for; None: the coordinator's.
    """

    identities: tuple[str, ...]
    anonymous: bool
    actions: tuple[str, ...]
    names: tuple[str, ...]
    max_lock_delay_seconds: int | None = None


@dataclass
class _Names:
    """The names one (identity, action) may use: every name, exact names, prefixes by length."""

    every: bool = False
    exact: set[str] = field(default_factory=set)
    prefixes: set[str] = field(default_factory=set)
    lengths: tuple[int, ...] = ()

    def add(self, pattern: str) -> None:
        if pattern == "*":
            self.every = True
        elif pattern.endswith("*"):
            self.prefixes.add(pattern[:-1])
        else:
            self.exact.add(pattern)

    def merge(self, other: _Names) -> None:
        self.every |= other.every
        self.exact |= other.exact
        self.prefixes |= other.prefixes

    def seal(self) -> None:
        self.lengths = tuple(sorted({len(p) for p in self.prefixes}))

    def matches(self, name: str) -> bool:
        if self.every or name in self.exact:
            return True
        prefixes = self.prefixes
        return any(name[:n] in prefixes for n in self.lengths)

    def may_match_under(self, prefix: str) -> bool:
        """Whether some name that starts with ``prefix`` could match."""
        if self.every:
            return True
        return (any(n.startswith(prefix) for n in self.exact)
                or any(p.startswith(prefix) or prefix.startswith(p) for p in self.prefixes))

    def covers_all_under(self, prefix: str) -> bool:
        """Whether every name that starts with ``prefix`` matches."""
        return self.every or any(prefix.startswith(p) for p in self.prefixes)


_NOTHING = _Names()
_NOTHING.seal()


class Policy:
    """A checked access policy: its rules folded into lookup tables.

    Args:
        rules: the rules, in file order (order does not change what they allow).
        source: the file they came from; :meth:`Access.reload` reads it again.

    Build one with :meth:`from_file` or :meth:`from_text`, which check the input.
    """

    def __init__(self, rules: Sequence[Rule], source: Path | None = None) -> None:
        self.rules = tuple(rules)
        self.source = source
        tables: dict[str | None, dict[str, _Names]] = {}  # identity (None: anonymous) -> action -> names
        for rule in self.rules:
            who: list[str | None] = list(rule.identities)
            if rule.anonymous:
                who.append(None)
            for identity in who:
                by_action = tables.setdefault(identity, {})
                for action in rule.actions:
                    names = by_action.setdefault(action, _Names())
                    for pattern in rule.names:
                        names.add(pattern)
        anyone = tables.pop(ANY_IDENTITY, {})
        for identity, by_action in tables.items():
            if identity is None:
                continue
            for action, names in anyone.items():
                by_action.setdefault(action, _Names()).merge(names)
        for by_action in [*tables.values(), anyone]:
            for names in by_action.values():
                names.seal()
        self._anonymous = tables.pop(None, {})
        self._named = tables
        self._anyone = anyone

    @classmethod
    def from_file(cls, path: str | Path) -> Policy:
        """Read and check a policy file, TOML or YAML by its ending (``.toml``, ``.yaml``, ``.yml``).

        Raises:
            PolicyError: the file cannot be read, has another ending, does not
                parse, or breaks the schema (the message names the rule and key).
        """
        path = Path(path)
        fmt = FORMATS.get(path.suffix.lower())
        if fmt is None:
            raise PolicyError(str(path), None, "must be a .toml, .yaml or .yml file (its ending gives the format)")
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise PolicyError(str(path), None, f"cannot be read: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise PolicyError(str(path), None, "is not UTF-8 text") from None
        return cls.from_text(text, fmt, source=path)

    @classmethod
    def from_text(cls, text: str, fmt: str = "toml", *, source: Path | None = None) -> Policy:
        """Parse and check a policy.

        Args:
            text: the policy, in ``fmt``.
            fmt: ``"toml"`` or ``"yaml"``.
            source: the file it came from, for messages and :meth:`Access.reload`.

        Raises:
            PolicyError: it does not parse or breaks the schema.
            ValueError: ``fmt`` is neither.
        """
        where = str(source) if source is not None else "<text>"
        if fmt == "toml":
            try:
                data: Any = tomllib.loads(text)
            except tomllib.TOMLDecodeError as exc:
                raise PolicyError(where, None, f"is not valid TOML: {exc}") from None
        elif fmt == "yaml":
            import yaml

            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise PolicyError(where, None, f"is not valid YAML: {' '.join(str(exc).split())}") from None
        else:
            raise ValueError(f"policy format {fmt!r}: must be toml or yaml")
        return cls(_rules(data, where), source)

    def allows(self, identity: str | None, action: str, name: str) -> bool:
        """Whether a rule allows ``identity`` to take ``action`` on the lock ``name``.

        Args:
            identity: the caller's identity (:attr:`.identity.Caller.identity`); None without a certificate.
            action: one of :data:`ACTIONS`.
            name: the lock name.
        """
        return self._names(identity, action).matches(name)

    def allows_some(self, identity: str | None, action: str) -> bool:
        """Whether a rule allows ``identity`` to take ``action`` on at least one name."""
        names = self._names(identity, action)
        return names.every or bool(names.exact) or bool(names.prefixes)

    def lister(self, identity: str | None, prefix: str) -> Callable[[str], bool] | None:
        """What ``identity`` may see of a listing of the names that start with ``prefix``.

        Returns:
            None when it may describe no name under ``prefix``; else a test
            of each listed name (always true when it may describe them all).
        """
        names = self._names(identity, DESCRIBE)
        if not names.may_match_under(prefix):
            return None
        if names.covers_all_under(prefix):
            return _everything
        return names.matches

    def _names(self, identity: str | None, action: str) -> _Names:
        if identity is None:
            table = self._anonymous
        else:
            table = self._named.get(identity, self._anyone)
        return table.get(action, _NOTHING)

    @property
    def summary(self) -> str:
        """``"3 rules"`` (``"1 rule"``), for messages."""
        return f"{len(self.rules)} rule{'' if len(self.rules) == 1 else 's'}"

    def __repr__(self) -> str:
        return f"Policy({self.summary} from {self.source or '<text>'})"


def _everything(_name: str) -> bool:
    return True


def _rules(data: Any, where: str) -> list[Rule]:
    """The checked rules of a parsed policy file (see the module's schema)."""
    if not isinstance(data, Mapping):
        raise PolicyError(where, None, "must hold a table (a mapping) with the key 'allow'")
    unknown = [str(k) for k in data if k != "allow"]
    if unknown:
        raise PolicyError(where, None, f"unknown key {unknown[0]!r}: the only top-level key is 'allow'")
    rules = data.get("allow")
    if not isinstance(rules, list) or not rules:
        raise PolicyError(where, "allow", "must be a non-empty list of rules ([[allow]] tables in TOML)")
    return [_rule(raw, where, f"allow[{index}]") for index, raw in enumerate(rules)]


def _rule(raw: Any, where: str, at: str) -> Rule:
    if not isinstance(raw, Mapping):
        raise PolicyError(where, at, "must be a table (a mapping) with the keys identities, actions, names")
    for key in raw:
        if key not in RULE_KEYS:
            raise PolicyError(where, f"{at}.{key}", f"unknown key; a rule has {', '.join(RULE_KEYS)}")
    anonymous = raw.get("anonymous", False)
    if not isinstance(anonymous, bool):
        raise PolicyError(where, f"{at}.anonymous", f"is {anonymous!r}; must be true or false")
    if "identities" not in raw and not anonymous:
        raise PolicyError(where, f"{at}.identities", "missing; name the identities allowed (\"*\" for every "
                                                     "verified identity), or set anonymous = true")
    identities = _strings(raw, "identities", where, at) if "identities" in raw else []
    for identity in identities:
        if identity != identity.strip() or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in identity):
            raise PolicyError(where, f"{at}.identities", f"{identity!r} has surrounding spaces or control "
                                                         f"characters; identities are matched exactly")
    actions = _strings(raw, "actions", where, at)
    for action in actions:
        if action not in ACTIONS:
            raise PolicyError(where, f"{at}.actions", f"{action!r} is not an action; use {', '.join(ACTIONS)}")
    names = _strings(raw, "names", where, at)
    for pattern in names:
        problem = _pattern_problem(pattern)
        if problem is not None:
            raise PolicyError(where, f"{at}.names", f"{pattern!r} {problem}")
    delay = raw.get("max_lock_delay_seconds")
    if delay is not None and (type(delay) is not int or not 0 <= delay <= MAX_LOCK_DELAY_SECONDS):
        raise PolicyError(where, f"{at}.max_lock_delay_seconds", f"is {delay!r}; must be a whole number of "
                                                                 f"seconds from 0 to {MAX_LOCK_DELAY_SECONDS}")
    return Rule(tuple(identities), anonymous, tuple(actions), tuple(names), delay)


def _strings(raw: Mapping[str, Any], key: str, where: str, at: str) -> list[str]:
    if key not in raw:
        raise PolicyError(where, f"{at}.{key}", "missing")
    value = raw[key]
    if not isinstance(value, list) or not value:
        raise PolicyError(where, f"{at}.{key}", "must be a non-empty list of strings")
    for item in value:
        if not isinstance(item, str) or not item:
            raise PolicyError(where, f"{at}.{key}", f"holds {item!r}; every item must be a non-empty string")
    return list(value)


def _pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` is not a name pattern (an exact name, a prefix ending in ``*``, or ``*``); None if it is."""
    if pattern == "*":
        return None
    body = pattern[:-1] if pattern.endswith("*") else pattern
    if "*" in body:
        return "has '*' before its end; '*' may only end a prefix (billing/*) or stand alone (every name)"
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in body):
        return "holds control characters, which no lock name can"
    if len(body.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"is longer than a lock name can be ({MAX_NAME_BYTES} bytes of UTF-8)"
    return None


def require(caller: Caller, action: str, name: str | None, policy: Policy | None) -> None:
    """Refuse, unless ``policy`` allows ``caller`` ``action`` on ``name`` (the check of each call).

    Args:
        caller: who calls (:func:`.identity.caller_of`).
        action: one of :data:`ACTIONS`.
        name: the lock name; None for a call that names none (allowed when the
            policy allows ``action`` on at least one name).
        policy: the policy in force; None allows everything.

    Raises:
        AccessDenied: reason ACCESS_DENIED, with the action, the name and the caller's identity.
    """
    if policy is None:
        return
    if name is None:
        if policy.allows_some(caller.identity, action):
            return
    elif policy.allows(caller.identity, action, name):
        return
    raise denied(caller, action, name)


def denied(caller: Caller, action: str, name: str | None) -> AccessDenied:
    """The error of a call the policy refuses (PERMISSION_DENIED / ACCESS_DENIED)."""
    who = repr(caller.identity) if caller.identity is not None else "a caller without a client certificate"
    what = repr(name) if name is not None else "any lock name"
    return AccessDenied(f"access policy: {who} may not {action} {what}", name=name, action=action,
                        identity=caller.identity)


class Access:
    """The policy in force on a coordinator, checked on each call and reloaded from its file.

    Args:
        policy: the policy; None for none (every call allowed, at the cost of one attribute read).
    """

    def __init__(self, policy: Policy | None = None) -> None:
        self.policy = policy

    def check(self, context: Any, action: str, name: str | None = None) -> None:
        """Refuse the call of ``context`` unless the policy allows it (see :func:`require`).

        Args:
            context: the call's ``grpc.aio.ServicerContext``.
            action: one of :data:`ACTIONS`.
            name: the lock name; None for a call that names none.

        Raises:
            AccessDenied: the policy does not allow it.
        """
        policy = self.policy
        if policy is not None:
            require(caller_of(context), action, name, policy)

    def require(self, caller: Caller, action: str, name: str | None = None) -> None:
        """Refuse ``caller`` unless the policy in force allows it ``action`` on ``name`` (see :func:`require`).

        For calls that know their :class:`~.identity.Caller` already (admin calls).

        Raises:
            AccessDenied: the policy does not allow it.
        """
        require(caller, action, name, self.policy)

    def lister(self, context: Any, prefix: str) -> Callable[[str], bool] | None:
        """The test of the names a ListLocks of ``prefix`` may show its caller; None without a policy.

        Raises:
            AccessDenied: (action describe, name ``prefix``) the caller may describe no name under ``prefix``.
        """
        policy = self.policy
        if policy is None:
            return None
        caller = caller_of(context)
        test = policy.lister(caller.identity, prefix)
        if test is None:
            raise denied(caller, DESCRIBE, prefix)
        return None if test is _everything else test

    def reload(self) -> bool:
        """Read the policy's file again; keep the policy in force if the new one cannot be used.

        Returns:
            True when the new policy is in force; False when it was refused
            (a warning names the file and the problem) and the old one stays.

        Raises:
            RuntimeError: there is no policy, or it came from no file.
        """
        if self.policy is None or self.policy.source is None:
            raise RuntimeError("no access policy file to reload")
        source = self.policy.source
        try:
            policy = Policy.from_file(source)
        except PolicyError as exc:
            log_event(_log, logging.WARNING, "policy_not_reloaded",
                      f"access policy not reloaded, the policy in use stays: {exc}",
                      file=str(source), problem=str(exc))
            return False
        self.policy = policy
        log_event(_log, logging.INFO, "policy_loaded", f"access policy loaded from {source}: {policy.summary}",
                  file=str(source), rules=len(policy.rules))
        return True

