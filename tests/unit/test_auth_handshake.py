"""The job-token handshake (procgroup._auth) over socketpair(): both sides prove the key,
and anything else a peer sends ends in AuthenticationError, never a hang."""

from __future__ import annotations

import socket
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from procgroup import _auth
from procgroup.errors import AuthenticationError, InvalidArgumentError

pytestmark = pytest.mark.unit

KEY = _auth.job_key("secret")


def _both_sides(client_key: bytes, server_key: bytes, *, client_purpose: bytes = b"store",
                server_purpose: bytes = b"store") -> tuple[BaseException | None, BaseException | None]:
    """Run the server on a thread and the client here; each side's error, or None."""
    a, b = socket.socketpair()
    errors: dict[str, BaseException | None] = {"server": None, "client": None}

    def serve() -> None:
        try:
            _auth.server_handshake(b, server_key, server_purpose, "client", timeout=5)
        except BaseException as exc:  # noqa: BLE001 - compared by the test
            errors["server"] = exc

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        _auth.client_handshake(a, client_key, client_purpose, "server", timeout=5)
    except BaseException as exc:  # noqa: BLE001 - compared by the test
        errors["client"] = exc
    thread.join(10)
    a.close()
    b.close()
    return errors["client"], errors["server"]


def test_the_same_key_passes_both_ways() -> None:
    assert _both_sides(KEY, KEY) == (None, None)


def test_a_different_key_is_refused_on_both_sides() -> None:
    client, server = _both_sides(_auth.job_key("other"), KEY)
    assert isinstance(client, AuthenticationError) and "refused this process's job token" in str(client)
    assert isinstance(server, AuthenticationError) and "did not prove it holds the job token" in str(server)


def test_the_purpose_is_part_of_the_proof() -> None:
    """A proof made for the store cannot open a data connection."""
    client, server = _both_sides(KEY, KEY, client_purpose=b"store", server_purpose=b"tcp")
    assert isinstance(client, AuthenticationError) and isinstance(server, AuthenticationError)


def test_a_server_that_cannot_prove_the_key_is_refused() -> None:
    """The client checks the server too: an impostor that says yes without the key fails."""
    hs = _auth.ClientHandshake(KEY, b"store", "impostor")
    hs.reply(_auth.MAGIC + bytes(_auth.NONCE_BYTES))
    with pytest.raises(AuthenticationError, match="impostor could not prove it holds the job token"):
        hs.check(b"\1" + bytes(_auth.MAC_BYTES))


def test_a_peer_that_is_not_procgroup_is_named() -> None:
    with pytest.raises(AuthenticationError, match="web server is not a procgroup endpoint"):
        _auth.ClientHandshake(KEY, b"store", "web server").reply(b"HTTP/1.1 400 Bad Request\r\n" + b"x" * 14)


def test_a_silent_peer_times_out_and_a_closing_one_is_named() -> None:
    a, b = socket.socketpair()
    with pytest.raises(AuthenticationError, match="did not finish in time"):
        _auth.client_handshake(a, KEY, b"store", "silent peer", timeout=0.2)
    b.close()
    with pytest.raises(AuthenticationError, match="closed the connection"):
        _auth.client_handshake(a, KEY, b"store", "gone peer", timeout=2)
    a.close()


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=2 * _auth.REPLY_BYTES))
def test_any_reply_without_the_key_is_refused(reply: bytes) -> None:
    server = _auth.ServerHandshake(KEY, b"store")
    server.greeting()
    ok, verdict = server.verdict(reply)
    assert not ok and verdict == bytes(_auth.VERDICT_BYTES)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=2 * _auth.GREETING_BYTES), st.binary(max_size=2 * _auth.VERDICT_BYTES))
def test_any_greeting_and_verdict_from_an_impostor_is_refused(greeting: bytes, verdict: bytes) -> None:
    client = _auth.ClientHandshake(KEY, b"store", "peer")
    try:
        client.reply(greeting)
        client.check(verdict)
    except AuthenticationError:
        return
    pytest.fail("an impostor's bytes were accepted")


def test_job_keys() -> None:
    assert _auth.job_key("a") == _auth.job_key(b"a") != _auth.job_key("b")
    assert _auth.job_key(None) == _auth.job_key("")
    with pytest.raises(InvalidArgumentError, match="at most 4096"):
        _auth.job_key("x" * (_auth.MAX_TOKEN_BYTES + 1))


def test_resolve_token(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (_auth.ENV_TOKEN, _auth.ENV_REQUIRE_TOKEN, *_auth.JOB_ID_VARS):
        monkeypatch.delenv(var, raising=False)
    assert _auth.resolve_token("t", "10.0.0.1", where="here") == _auth.job_key("t")
    monkeypatch.setenv(_auth.ENV_TOKEN, "from-env")
    assert _auth.resolve_token(None, "10.0.0.1", where="here") == _auth.job_key("from-env")
    monkeypatch.delenv(_auth.ENV_TOKEN)
    assert _auth.resolve_token(None, "127.0.0.1", where="here") == _auth.job_key(None)
    monkeypatch.setenv("SLURM_JOB_ID", "77")  # no token: jobs are told apart by the launcher's id
    assert _auth.resolve_token(None, "127.0.0.1", where="here") not in (_auth.job_key(None), _auth.job_key("77"))
    monkeypatch.setenv(_auth.ENV_REQUIRE_TOKEN, "1")
    with pytest.raises(AuthenticationError, match=f"here: no job token, and {_auth.ENV_REQUIRE_TOKEN}=1"):
        _auth.resolve_token(None, "10.0.0.1", where="here")
