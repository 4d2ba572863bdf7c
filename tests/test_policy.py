"""The access policy (issue 9): parsing and matching (a real coordinator that enforces it:
tests/test_policy_enforced.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from fencepost.client import AccessDenied
from fencepost.coordinator.admission.access import Access, Policy, PolicyError, require
from fencepost.coordinator.admission.identity import Caller
from fencepost.coordinator.process.listen import is_local

from .client_identities import BILLING


# ---------------------------------------------------------------- parsing


def _toml(rule: str, *, head: str = "") -> str:
    return f"{head}\n[[allow]]\n{rule}\n"


GOOD_RULE = 'identities = ["a"]\nactions = ["acquire"]\nnames = ["x"]'


@pytest.mark.parametrize(("text", "where", "problem"), [
    (_toml(GOOD_RULE, head='version = 1'), None, "unknown key 'version'"),
    ("allow = []", "allow", "must be a non-empty list of rules"),
    ("", "allow", "must be a non-empty list of rules"),
    ('allow = ["x"]', "allow[0]", "must be a table"),
    (_toml(GOOD_RULE + '\nname = ["y"]'), "allow[0].name", "unknown key"),
    (_toml('actions = ["acquire"]\nnames = ["x"]'), "allow[0].identities", "missing"),
    (_toml('identities = []\nactions = ["acquire"]\nnames = ["x"]'), "allow[0].identities", "non-empty list"),
    (_toml('identities = [1]\nactions = ["acquire"]\nnames = ["x"]'), "allow[0].identities", "holds 1"),
    (_toml('identities = [" a"]\nactions = ["acquire"]\nnames = ["x"]'), "allow[0].identities", "spaces"),
    (_toml('identities = ["a"]\nnames = ["x"]'), "allow[0].actions", "missing"),
    (_toml('identities = ["a"]\nactions = []\nnames = ["x"]'), "allow[0].actions", "non-empty list"),
    (_toml('identities = ["a"]\nactions = ["aquire"]\nnames = ["x"]'), "allow[0].actions",
     "'aquire' is not an action; use acquire, release, describe, admin"),
    (_toml('identities = ["a"]\nactions = ["acquire"]'), "allow[0].names", "missing"),
    (_toml('identities = ["a"]\nactions = ["acquire"]\nnames = "x"'), "allow[0].names", "non-empty list"),
    (_toml('identities = ["a"]\nactions = ["acquire"]\nnames = ["a*b"]'), "allow[0].names",
     "'a*b' has '*' before its end"),
    (_toml('identities = ["a"]\nactions = ["acquire"]\nnames = ["**"]'), "allow[0].names", "before its end"),
    (_toml('identities = ["a"]\nactions = ["acquire"]\nnames = ["' + "n" * 257 + '"]'), "allow[0].names",
     "longer than a lock name"),
    (_toml('anonymous = "yes"\nactions = ["acquire"]\nnames = ["x"]'), "allow[0].anonymous", "true or false"),
    (_toml(GOOD_RULE) + _toml('identities = ["b"]\nactions = ["describe"]\nnames = ["x*y"]'), "allow[1].names",
     "before its end"),
])
def test_parse_when_a_field_is_bad(text: str, where: str | None, problem: str, tmp_path: Path) -> None:
    """A policy file that breaks the schema is refused with an error naming the file, the rule index and the key."""
    path = tmp_path / "policy.toml"
    path.write_text(text)
    with pytest.raises(PolicyError) as caught:
        Policy.from_file(path)
    assert caught.value.where == where
    assert problem in caught.value.problem
    assert str(caught.value).startswith(f"policy {path}: {where + ': ' if where else ''}")


@pytest.mark.parametrize(("name", "text", "problem"), [
    ("policy.json", "{}", "must be a .toml, .yaml or .yml file"),
    ("missing.toml", None, "cannot be read: No such file or directory"),
    ("policy.toml", "[[allow]\n", "is not valid TOML"),
    ("policy.yaml", "allow: [\n", "is not valid YAML"),
    ("policy.yml", "- just\n- a list\n", "must hold a table"),
    ("policy.yaml", "allow:\n  - identities: [a]\n    actions: [acquire]\n    names: [7]\n", "holds 7"),
])
def test_parse_when_the_file_is_unusable(name: str, text: str | None, problem: str, tmp_path: Path) -> None:
    """An unknown ending, an unreadable file, a syntax error or a file that is not a table is refused, naming it."""
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(PolicyError, match=rf"^policy {path}: .*{problem}"):
        Policy.from_file(path)


def test_parse_when_yaml_and_toml_say_the_same(tmp_path: Path) -> None:
    """The YAML form of a policy allows exactly what its TOML form allows."""
    (tmp_path / "p.toml").write_text(
        '[[allow]]\nidentities = ["a", "*"]\nanonymous = true\nactions = ["acquire", "release"]\n'
        'names = ["jobs/*", "one"]\n')
    (tmp_path / "p.yaml").write_text(
        "allow:\n  - identities: [a, '*']\n    anonymous: true\n    actions: [acquire, release]\n"
        "    names: [jobs/*, one]\n")
    toml, yaml = Policy.from_file(tmp_path / "p.toml"), Policy.from_file(tmp_path / "p.yaml")
    assert toml.rules == yaml.rules
    assert yaml.source == tmp_path / "p.yaml"


# ---------------------------------------------------------------- matching


MATCHING = """
[[allow]]
identities = ["spiffe://example.org/billing"]
actions = ["acquire", "release"]
names = ["billing/*", "reports/daily"]

[[allow]]
identities = ["*"]
actions = ["describe"]
names = ["public-*"]

[[allow]]
identities = ["ops.example"]
actions = ["admin", "describe"]
names = ["*"]

[[allow]]
anonymous = true
actions = ["describe"]
names = ["status"]
"""


@pytest.mark.parametrize(("identity", "action", "name", "allowed"), [
    (BILLING, "acquire", "billing/invoices", True),  # prefix
    (BILLING, "acquire", "billing/", True),  # the prefix itself is a name that starts with it
    (BILLING, "acquire", "billing", False),  # "billing/*" needs the slash
    (BILLING, "acquire", "billingx/a", False),
    (BILLING, "release", "reports/daily", True),  # exact
    (BILLING, "release", "reports/daily/x", False),  # exact is not a prefix
    (BILLING, "describe", "billing/invoices", False),  # not among the rule's actions
    (BILLING, "describe", "public-a", True),  # "*" rules apply to named identities too
    ("SPIFFE://example.org/billing", "acquire", "billing/a", False),  # identities match exactly
    ("someone.example", "describe", "public-", True),  # any verified identity
    ("someone.example", "describe", "public", False),
    ("someone.example", "acquire", "public-a", False),
    ("ops.example", "admin", "anything at all", True),  # "*" names
    ("ops.example", "acquire", "billing/a", False),
    (None, "describe", "status", True),  # anonymous
    (None, "describe", "public-a", False),  # "*" is verified identities only
    ("anonymous", "describe", "status", False),  # no certificate can claim the anonymous rule
])
def test_allows_when_matching(identity: str | None, action: str, name: str, allowed: bool) -> None:
    """Exact names, prefixes ending in *, "*" names, "*" identities and the anonymous rule match as documented."""
    assert Policy.from_text(MATCHING).allows(identity, action, name) is allowed


def test_lister_when_listing_a_prefix() -> None:
    """A listing shows all of a prefix a rule covers, filters one it covers in part, and is refused otherwise."""
    policy = Policy.from_text(MATCHING)
    assert policy.lister("ops.example", "") is not None and policy.lister("ops.example", "")("any")
    everything = policy.lister("someone.example", "public-x")
    assert everything is not None and everything("public-xyz")
    some = policy.lister("someone.example", "")
    assert some is not None and some("public-1") and not some("billing/a")
    assert policy.lister("someone.example", "pub") is not None  # "public-*" names start with "pub"
    assert policy.lister("someone.example", "billing/") is None
    assert policy.lister(None, "st") is not None and policy.lister(None, "x") is None


def test_require_when_the_call_names_no_lock() -> None:
    """A call without a lock name needs the action on at least one name; the denial names action and identity."""
    policy = Policy.from_text(MATCHING)
    require(Caller(BILLING, "ipv4:127.0.0.1:1"), "acquire", None, policy)
    require(Caller("ops.example", "ipv4:127.0.0.1:1"), "admin", None, policy)
    with pytest.raises(AccessDenied) as caught:
        require(Caller("someone.example", "ipv4:127.0.0.1:1"), "acquire", None, policy)
    assert caught.value.action == "acquire" and caught.value.name is None
    assert caught.value.identity == "someone.example"
    assert "'someone.example' may not acquire any lock name" in caught.value.message
    require(Caller(None, "ipv4:127.0.0.1:1"), "admin", None, None)  # no policy: everything allowed


def test_reload_when_the_new_file_is_broken(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Access.reload takes a good new file and keeps the policy in force when the new file is broken."""
    path = tmp_path / "p.toml"
    path.write_text(_toml('identities = ["a"]\nactions = ["acquire"]\nnames = ["x"]'))
    access = Access(Policy.from_file(path))
    path.write_text(_toml('identities = ["a"]\nactions = ["acquire"]\nnames = ["y"]'))
    assert access.reload()
    assert access.policy is not None and access.policy.allows("a", "acquire", "y")
    path.write_text(_toml('identities = ["a"]\nactions = ["grab"]\nnames = ["x"]'))
    with caplog.at_level(logging.WARNING, "fencepost.coordinator.admission.access"):
        assert not access.reload()
    assert access.policy.allows("a", "acquire", "y") and not access.policy.allows("a", "acquire", "x")
    [record] = [r for r in caplog.records if getattr(r, "event", None) == "policy_not_reloaded"]
    assert record.event_fields["file"] == str(path)  # type: ignore[attr-defined]
    assert "allow[0].actions: 'grab' is not an action" in record.event_fields["problem"]  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="no access policy file"):
        Access(Policy.from_text(MATCHING)).reload()


def test_is_local_when_listening() -> None:
    """Loopback addresses, localhost and Unix sockets are local; wildcard and other addresses are not."""
    assert all(is_local(a) for a in ("127.0.0.1:7420", "127.9.9.9:0", "[::1]:7420", "localhost:1", "unix:/tmp/s"))
    assert not any(is_local(a) for a in ("0.0.0.0:7420", "[::]:7420", "10.1.2.3:7420", "coord.example:7420"))
