"""Settings parsing (procgroup._settings, procgroup.config): every bad value is an
InvalidArgumentError that names the value and where it came from."""

from __future__ import annotations

import datetime
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from procgroup import config
from procgroup._settings import (
    MAX_TIMEOUT_S,
    env_bytes,
    env_choice,
    env_flag,
    env_timeout,
    setting,
    timeout_seconds,
)
from procgroup.errors import InvalidArgumentError

pytestmark = pytest.mark.unit

ENV = "PROCGROUP_UNIT_TEST_SETTING"


def test_option_beats_environment_beats_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, " Yes ")
    assert setting("knob", ENV, "d", {"knob": " OFF "}) == ("off", "option 'knob'")
    assert setting("knob", ENV, "d", {"knob": None}) == ("yes", f"environment variable {ENV}")
    monkeypatch.setenv(ENV, "   ")  # blank counts as unset
    assert setting("knob", ENV, "d", {}) == ("d", "default")


@pytest.mark.parametrize("raw, expected", [("1", True), ("TRUE", True), ("on", True), ("yes", True),
                                           ("0", False), ("false", False), ("Off", False), ("no", False)])
def test_env_flag_words(monkeypatch: pytest.MonkeyPatch, raw: str, expected: bool) -> None:
    monkeypatch.setenv(ENV, raw)
    assert env_flag(ENV, not expected) is expected


def test_env_flag_refuses_other_words_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "maybe")
    with pytest.raises(InvalidArgumentError, match=f"environment variable {ENV}='maybe'"):
        env_flag(ENV, True)
    with pytest.raises(InvalidArgumentError, match="option 'flag'='2'"):
        env_flag(ENV, True, name="flag", options={"flag": 2})


def test_env_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    assert env_choice(ENV, ("a", "b"), "a") == "a"
    monkeypatch.setenv(ENV, "B")
    assert env_choice(ENV, ("a", "b"), "a") == "b"
    monkeypatch.setenv(ENV, "c")
    with pytest.raises(InvalidArgumentError, match="choose one of a, b"):
        env_choice(ENV, ("a", "b"), "a")


def test_env_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    assert env_bytes(ENV, None) is None
    monkeypatch.setenv(ENV, "4096")
    assert env_bytes(ENV, 1, minimum=1) == 4096
    for bad in ("-1", "4k", "1.5"):
        monkeypatch.setenv(ENV, bad)
        with pytest.raises(InvalidArgumentError, match=r"expected a number of bytes >= 0 \(0: autotune\)"):
            env_bytes(ENV, None, hint="0: autotune")


def test_timeout_forms() -> None:
    assert timeout_seconds(5) == 5.0
    assert timeout_seconds(0.25) == 0.25
    assert timeout_seconds("12.5") == 12.5
    assert timeout_seconds(datetime.timedelta(minutes=2)) == 120.0
    assert timeout_seconds(MAX_TIMEOUT_S) == MAX_TIMEOUT_S


@pytest.mark.parametrize("bad", [0, -1, True, None, "soon", math.inf, math.nan, MAX_TIMEOUT_S * 2,
                                 datetime.timedelta(0), [5]])
def test_timeout_refusals_name_the_source(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="^where="):
        timeout_seconds(bad, source="where")


@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(), st.text(max_size=20),
                 st.booleans(), st.none()))
def test_timeout_is_positive_and_bounded_or_refused(value: object) -> None:
    try:
        seconds = timeout_seconds(value)
    except InvalidArgumentError:
        return
    assert 0 < seconds <= MAX_TIMEOUT_S


def test_env_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert env_timeout(ENV, 7.0) == 7.0
    monkeypatch.setenv(ENV, "3")
    assert env_timeout(ENV, 7.0) == 3.0
    monkeypatch.setenv(ENV, "-3")
    with pytest.raises(InvalidArgumentError, match=f"environment variable {ENV}"):
        env_timeout(ENV, 7.0)


def test_init_settings_defaults_come_from_the_environment() -> None:
    env = {config.ENV_BACKEND: "MPI", config.ENV_TIMEOUT: "42"}
    s = config.init_settings(None, None, -1, -1, "", None, environ=env)
    assert (s.backend, s.timeout, s.world_size, s.rank, s.init_method) == ("mpi", 42.0, -1, -1, None)
    s = config.init_settings(None, "env://", 4, 2, "g", 9, environ={})
    assert (s.backend, s.timeout, s.world_size, s.rank) == (config.DEFAULT_BACKEND, 9.0, 4, 2)
    assert s.init_method == "env://" and s.group_name == "g"


@pytest.mark.parametrize("field, args, words", [
    ("world_size", dict(world_size=-2), "world_size=-2: must be >= -1"),
    ("rank", dict(rank="one"), "rank='one': must be a whole number"),
    ("backend", dict(backend=""), "backend='': must not be empty"),
    ("group_name", dict(group_name=3), "group_name=3: must be a str"),
])
def test_init_settings_errors_in_procgroups_words(field: str, args: dict[str, object], words: str) -> None:
    values: dict[str, object] = dict(backend="tcp", init_method=None, world_size=-1, rank=-1,
                                     group_name="", timeout=None)
    values.update(args)
    with pytest.raises(InvalidArgumentError, match="^init_process_group: ") as info:
        config.init_settings(environ={}, **values)
    assert words in str(info.value) and "Input should" not in str(info.value)


def test_world_size_zero_only_where_the_launcher_decides() -> None:
    s = config.init_settings("mpi", None, 0, -1, "", None, environ={})
    s.refuse_size_zero(unless=True)
    with pytest.raises(InvalidArgumentError, match="argument world_size=0: must be positive, or -1"):
        s.refuse_size_zero(unless=False)


def test_every_bad_argument_is_named_at_once() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        config.init_settings("tcp", 5, -7, True, "", None, environ={}, options=[1], token=3)
    text = str(info.value)
    for words in ("argument init_method=5: must be a str", "argument world_size=-7: must be >= -1",
                  "argument rank=True: must be a whole number", "argument options=[1]: must be a dict, got list",
                  "argument token=3: must be a str or bytes, got int"):
        assert words in text, text
    assert config.init_settings("tcp", None, "4", " 2", "", None, environ={}).world_size == 4  # from env text


def test_a_store_needs_rank_and_size_and_no_init_method() -> None:
    store = object()
    s = config.init_settings("tcp", None, 2, 1, "", None, environ={}, store=store)
    assert s.store is store
    for args, words in (((None, -1, 1), "rank and world_size must be given"),
                        (("env://", 2, 1), "either init_method or store"),
                        ((None, 2, 2), "rank 2 is outside the world of size 2")):
        with pytest.raises(InvalidArgumentError, match=words):
            config.init_settings("tcp", args[0], args[1], args[2], "", None, environ={}, store=store)


def test_init_settings_names_the_timeout_variable() -> None:
    with pytest.raises(InvalidArgumentError, match=f"environment variable {config.ENV_TIMEOUT}='x'"):
        config.init_settings("tcp", None, -1, -1, "", None, environ={config.ENV_TIMEOUT: "x"})
