"""The ``fencepost`` client commands over TLS: --tls, --ca, --cert, --key, --tls-server-name and their variables.

Bad TLS input is checked in-process (``cli.main``: it exits 2 before any
connection); the rest runs ``fencepost`` as subprocesses against real
grpc.aio TLS servers serving the real LockService (tests/lock_servers.py),
with trustme certificates (tests/tls_pki.py).
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
import uuid
from pathlib import Path

import pytest

from fencepost.client import TlsConfig
from fencepost.client import cli
from fencepost.client.cli import common, flags
from fencepost.client.cli.run import child_environment

from . import lock_servers, tls_pki
from .cli_helpers import assert_one_line_error, free_port, run_cli
from .conftest import CLIENT_ENV, CliResult, cli_env
from .lock_servers import Start
from .tls_pki import Pki

pki = tls_pki.pki  # the fixtures
serve = lock_servers.serve


async def fencepost(*args: str, env: dict[str, str] | None = None, cwd: str | None = None,
                    timeout: float = 30.0) -> CliResult:
    """Run ``fencepost ARGS...`` (:func:`tests.test_cli.run_cli`) with ``env`` added and gRPC's own logging off.

    gRPC core logs each failed handshake to stderr itself (``I... ssl_transport_security.cc ...
    Handshake failed``), above the command's one line; it reads GRPC_VERBOSITY only when
    grpc is imported, before the command could set it, so the tests set it to NONE.
    """
    return await run_cli(*args, timeout=timeout, env={"GRPC_VERBOSITY": "NONE", **(env or {})}, cwd=cwd)


def _name() -> str:
    return f"tls:{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------- the flags and variables, parsed


@pytest.fixture
def no_tls_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """None of the client's variables set in this process."""
    for name in CLIENT_ENV:
        monkeypatch.delenv(name, raising=False)


NONE = {flag: None for flag in common.TLS_FLAGS}


def test_parse_tls_when_flags_and_variables_combine(pki: Pki) -> None:
    """No setting is plaintext; --tls or FENCEPOST_TLS=1 alone trusts the system's CAs; a flag wins over its variable."""
    assert flags.parse_tls(NONE, False, {}) is None
    assert flags.parse_tls(NONE, False, {common.TLS_ENV: "0"}) is None
    assert flags.parse_tls(NONE, True, {}) == TlsConfig()
    assert flags.parse_tls(NONE, False, {common.TLS_ENV: "yes"}) == TlsConfig()
    assert flags.parse_tls({**NONE, "--ca": pki.ca_file}, False, {}) == TlsConfig(ca=pki.ca_file)
    assert flags.parse_tls({**NONE, "--tls-server-name": "n.example"}, False, {}) == TlsConfig(server_name="n.example")
    mixed = flags.parse_tls({**NONE, "--cert": pki.client.cert, "--key": pki.client.key}, False,
                             {common.CA_ENV: pki.ca_file, common.CERT_ENV: "/nonexistent.pem"})
    assert mixed == TlsConfig(ca=pki.ca_file, cert=pki.client.cert, key=pki.client.key)
    with pytest.raises(common.CliError, match=r"invalid \$FENCEPOST_TLS: 'maybe'") as info:
        flags.parse_tls(NONE, False, {common.TLS_ENV: "maybe"})
    assert info.value.exit_code == common.EXIT_USAGE


def test_child_environment_when_tls_is_given_makes_paths_absolute(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    """run's child gets FENCEPOST_TLS=1 and each TLS setting, paths absolute; nothing TLS without TLS."""
    monkeypatch.chdir(pki.dir)
    tls = TlsConfig(ca="ca.pem", cert=Path("client.pem"), key="client-key.pem", server_name="n.example")
    env = child_environment({}, name="n", token=7, lease_id=9, ttl=3, addresses=["a:1"], tls=tls)
    assert env[common.TLS_ENV] == "1" and env[common.TLS_SERVER_NAME_ENV] == "n.example"
    assert (env[common.CA_ENV], env[common.CERT_ENV], env[common.KEY_ENV]) == (
        pki.ca_file, pki.client.cert, pki.client.key)
    assert not set(CLIENT_ENV[1:]) & set(child_environment({}, name="n", token=7, lease_id=9, ttl=3,
                                                               addresses=["a:1"]))


COMMANDS = {
    "status": ["status", "x"],
    "status-health": ["status"],
    "acquire": ["acquire", "x", "--ttl", "2"],
    "release": ["release", "x", "--lease-id", "0x10", "--token", "3"],
    "run": ["run", "x", "--ttl", "2"],
}


def _bad_tls(pki: Pki, tmp: Path) -> dict[str, tuple[list[str], dict[str, str], str]]:
    """id -> (flags, variables, the words of the one error line)."""
    text = tmp / "notes.txt"
    text.write_text("not PEM\n")
    missing = str(tmp / "missing.pem")
    return {
        "ca-missing": (["--ca", missing], {}, f"invalid --ca: cannot read '{missing}': No such file or directory"),
        "ca-no-pem": (["--ca", str(text)], {}, f"invalid --ca: '{text}' holds no PEM certificate"),
        "cert-without-key": (["--cert", pki.client.cert], {}, "invalid --key: --cert is given without its key"),
        "key-without-cert": (["--key", pki.client.key], {}, "invalid --cert: --key is given without its certificate"),
        "key-not-the-certs": (["--cert", pki.client.cert, "--key", pki.other_client.key], {},
                              f"invalid --key: '{pki.other_client.key}' is not the key of the certificate in --cert"),
        "ca-variable-missing": ([], {common.CA_ENV: missing},
                                f"invalid --ca (from ${common.CA_ENV}): cannot read '{missing}'"),
        "server-name-empty": (["--tls-server-name", ""], {}, "invalid --tls-server-name: must be a non-empty name"),
    }


@pytest.mark.parametrize("case", ["ca-missing", "ca-no-pem", "cert-without-key", "key-without-cert",
                                  "key-not-the-certs", "ca-variable-missing", "server-name-empty"])
def test_commands_when_tls_input_is_bad_exit_2_naming_the_flag(
    case: str, pki: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    no_tls_env: None, no_connect: list[str],
) -> None:
    """Every command that talks to a coordinator refuses bad TLS input with exit 2 and one line naming the flag."""
    flags, variables, words = _bad_tls(pki, tmp_path)[case]
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    for command, argv in COMMANDS.items():
        tail = ["--", "true"] if command == "run" else []
        rc = cli.main([*argv, "--address", f"127.0.0.1:{free_port()}", *flags, *tail])
        err = capsys.readouterr().err
        assert rc == common.EXIT_USAGE, (command, err)
        assert_one_line_error(CliResult(rc, "", err), f"fencepost {command.split('-')[0]}: {words}")


# ---------------------------------------------------------------- against TLS servers


async def test_status_release_acquire_and_run_over_mtls(pki: Pki, serve: Start) -> None:
    """Flags and variables both work over mTLS; status --json is unchanged; run's child connects with the same TLS."""
    plain = await serve()
    server = await serve(pki.server(client_ca=pki.ca))
    flags = ["--ca", pki.ca_file, "--cert", pki.client.cert, "--key", pki.client.key]
    variables = {common.CA_ENV: pki.ca_file, common.CERT_ENV: pki.client.cert, common.KEY_ENV: pki.client.key}
    name = _name()

    health = await fencepost("status", "--address", server.address, *flags)
    assert health.rc == 0 and f"coordinator {server.address}: SERVING" in health.out, health
    over_tls = await fencepost("status", name, "--json", "--address", server.address, env=variables)
    assert over_tls.rc == 0, over_tls
    over_plain = await fencepost("status", name, "--json", "--address", plain.address)
    assert set(json.loads(over_tls.out)) == set(json.loads(over_plain.out))
    assert json.loads(over_tls.out)["held"] is False

    released = await fencepost("release", name, "--lease-id", "0x10", "--token", "3", "--address", server.address,
                               *flags)
    assert released.rc == common.EXIT_PRECONDITION, released  # the coordinator answered: not the holder

    # run with relative paths from the pki directory; the child changes directory, then asks status.
    relative = ["--ca", "ca.pem", "--cert", "client.pem", "--key", "client-key.pem"]
    child = (f'cd / && "{sys.executable}" -m fencepost.client.cli status "$FENCEPOST_LOCK" --json '
             f'&& echo "token=$FENCEPOST_TOKEN tls=$FENCEPOST_TLS ca=$FENCEPOST_CA"')
    ran = await fencepost("run", name, "--ttl", "5", "--address", server.address, *relative, "--", "sh", "-c", child,
                          cwd=str(pki.dir))
    assert ran.rc == 0, ran
    described, echoed = ran.out.strip().splitlines()
    assert echoed == f"token={json.loads(described)['token']} tls=1 ca={pki.ca_file}", ran.out
    assert json.loads(described)["held"] is True

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fencepost.client.cli", "acquire", name, "--ttl", "5", "--address", server.address,
        *flags, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=cli_env())
    try:
        assert proc.stdout is not None
        token = int(await asyncio.wait_for(proc.stdout.readline(), 20))
        st = await fencepost("status", name, "--json", "--address", server.address, env=variables)
        assert json.loads(st.out)["token"] == token
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 20)
        assert proc.returncode == 0, err
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.communicate()


async def test_commands_when_tls_fails_exit_1_naming_the_cause_in_flags(pki: Pki, serve: Start) -> None:
    """A failed handshake is exit 1 with one line naming the cause, in the flags' words."""
    tls = await serve(pki.server())
    mtls = await serve(pki.server(client_ca=pki.ca))
    cases = [
        (["status", "x", "--address", tls.address],
         f"cannot reach the coordinator at {tls.address}: plaintext connection to {tls.address} failed: the "
         f"coordinator speaks TLS, and this client connects without it (give --tls, or --ca with the coordinator's CA)"),
        (["status", "x", "--address", tls.address, "--ca", pki.other_ca_file],
         f"TLS handshake with {tls.address} failed: the coordinator's certificate is not signed by a CA in "
         f"--ca ({pki.other_ca_file})"),
        (["status", "x", "--address", tls.address, "--tls"],
         "the coordinator's certificate is not signed by a CA in "),
        (["acquire", "x", "--ttl", "2", "--address", mtls.address, "--ca", pki.ca_file],
         f"coordinator unavailable at {mtls.address}: TLS handshake with {mtls.address} failed: the coordinator "
         f"requires a client certificate, and none was given: set --cert and --key"),
        (["run", "x", "--ttl", "2", "--address", tls.address, "--ca", pki.ca_file, "--tls-server-name", "n.example",
          "--", "true"],
         "the coordinator's certificate does not name 'n.example' (--tls-server-name)"),
    ]
    for argv, words in cases:
        result = await fencepost(*argv)
        assert result.rc == common.EXIT_UNAVAILABLE, (argv, result)
        assert_one_line_error(result, words)

    # One address down, the other refusing the handshake: the TLS cause is in the message, in flags' words too.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        down = f"127.0.0.1:{probe.getsockname()[1]}"  # nothing listens there once closed
    for command in (["status", "x"], ["acquire", "x", "--ttl", "2", "--timeout", "1"]):
        result = await fencepost(*command, "--address", f"{down},{mtls.address}", "--ca", pki.ca_file)
        assert result.rc == common.EXIT_UNAVAILABLE, (command, result)
        assert "set --cert and --key" in result.err and "tls." not in result.err, (command, result.err)

    health = await fencepost("status", "--json", "--address", tls.address, "--ca", pki.other_ca_file)
    assert health.rc == common.EXIT_UNAVAILABLE, health
    (coordinator,) = json.loads(health.out)["coordinators"]
    assert coordinator["status"] == "UNREACHABLE"
    assert coordinator["detail"].startswith(f"TLS handshake with {tls.address} failed: the coordinator's "
                                            f"certificate is not signed by a CA in --ca"), coordinator


async def test_status_over_tls_when_variable_says_tls(pki: Pki, serve: Start) -> None:
    """FENCEPOST_TLS=1 with FENCEPOST_TLS_SERVER_NAME and FENCEPOST_CA reaches a certificate for another name."""
    server = await serve(pki.server(pki.named))
    result = await fencepost("status", _name(), "--json", "--address", server.address,
                             env={common.TLS_ENV: "1", common.CA_ENV: pki.ca_file,
                                  common.TLS_SERVER_NAME_ENV: tls_pki.OTHER_NAME})
    assert result.rc == 0, result
    assert json.loads(result.out)["address"] == server.address
