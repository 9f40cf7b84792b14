"""Pure tables and parsers: procgroup-run's option parsers, the error hierarchy, the
reduction lowering tables and master-worker's tag spaces."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from procgroup import errors
from procgroup._launch import options
from procgroup.backend import ReduceTable
from procgroup.backend._lowering import flat_view
from procgroup.errors import InvalidArgumentError, UnsupportedOperationError
from procgroup.ops import ReduceOp
from procgroup.remote import _protocol

pytestmark = pytest.mark.unit


# ------------------------------------------------------------------ procgroup-run's options
def test_nproc_values() -> None:
    assert options.parse_nproc(" 8 ") == 8
    assert options.parse_nproc("cpu") >= 1
    with pytest.raises(InvalidArgumentError, match="no XPU support"):
        options.parse_nproc("xpu")
    with pytest.raises(InvalidArgumentError, match="--nproc-per-node must be a number or auto, cpu, gpu; got 'many'"):
        options.parse_nproc("many")


def test_nnodes_refuses_elastic_ranges() -> None:
    assert options.parse_nnodes("4") == 4 and options.parse_nnodes("2:2") == 2
    with pytest.raises(InvalidArgumentError, match="elastic ranges are not supported"):
        options.parse_nnodes("1:4")
    with pytest.raises(InvalidArgumentError, match="--nnodes must be N or N:N, got 'x'"):
        options.parse_nnodes("x")


def test_std_specs() -> None:
    assert options.parse_std("3", "--redirects") == {-1: 3}
    assert options.parse_std("0:3,1:1", "--redirects") == {0: 3, 1: 1}
    assert options.expand_std({-1: 2}, 3) == {0: 2, 1: 2, 2: 2}
    assert options.expand_std({1: 1}, 3) == {1: 1}
    for bad in ("4", "0:4", "a:1", "0-1", "0:"):
        with pytest.raises(InvalidArgumentError, match="--tee must be 0"):
            options.parse_std(bad, "--tee")


def test_rank_lists_and_endpoints() -> None:
    assert options.parse_ranks("0,2, 3,", "--local-ranks-filter") == frozenset({0, 2, 3})
    with pytest.raises(InvalidArgumentError, match="--local-ranks-filter must be comma-separated"):
        options.parse_ranks("0,a", "--local-ranks-filter")
    assert options.parse_endpoint("node1:1234") == ("node1", 1234)
    assert options.parse_endpoint("node1") == ("node1", options.DEFAULT_RDZV_PORT)
    assert options.parse_endpoint("[fe80::1]:99") == ("fe80::1", 99)
    assert options.parse_endpoint("fe80::1") == ("fe80::1", options.DEFAULT_RDZV_PORT)
    with pytest.raises(InvalidArgumentError, match="needs a host"):
        options.parse_endpoint(":80")
    with pytest.raises(InvalidArgumentError, match="port must be a number"):
        options.parse_endpoint("host:http")


@given(st.text(max_size=30))
def test_option_parsers_answer_or_refuse_clearly(text: str) -> None:
    """Whatever a user types, the parsers return a value or raise InvalidArgumentError."""
    for parse in (options.parse_nnodes, options.parse_endpoint,
                  lambda v: options.parse_std(v, "--tee"), lambda v: options.parse_ranks(v, "--x")):
        try:
            parse(text)
        except InvalidArgumentError:
            pass


# ------------------------------------------------------------------ errors
def test_every_error_is_a_procgroup_error_and_a_builtin_one() -> None:
    classes = [getattr(errors, name) for name in errors.__all__ if isinstance(getattr(errors, name), type)]
    assert len(classes) >= 10
    for cls in classes:
        assert issubclass(cls, errors.ProcGroupError)
        if cls is not errors.ProcGroupError:
            assert any(b is not errors.ProcGroupError and not issubclass(b, errors.ProcGroupError)
                       for b in cls.__mro__[1:-1]), f"{cls.__name__} has no builtin base to catch it by"
    assert issubclass(errors.CommTimeoutError, TimeoutError)
    assert issubclass(errors.PeerError, ConnectionError)
    assert issubclass(errors.InvalidArgumentError, ValueError)


def test_error_records() -> None:
    e = errors.PeerError("rank 3 died", rank=3)
    assert (e.rank, e.ranks, str(e)) == (3, (3,), "rank 3 died")
    assert errors.PeerError("x", rank=1, ranks=[1, 2]).ranks == (1, 2)
    assert errors.PeerError("x").ranks == ()
    t = errors.CommTimeoutError("late", op="barrier", ranks=iter([0, 5]))
    assert (t.op, t.ranks) == ("barrier", (0, 5))
    assert errors.GroupRevokedError("r", ranks=[4]).ranks == (4,)
    assert errors.PeerError("x").seq is None


# ------------------------------------------------------------------ reduction lowering
TABLE = ReduceTable(
    backend="demo",
    dtypes={"float32": "F32", "float64": "F64", "int32": "I32", "uint8": "U8"},
    ops={ReduceOp.SUM: "sum", ReduceOp.MAX: "max", ReduceOp.MIN: "min", ReduceOp.PRODUCT: "prod"},
    bool_ops={ReduceOp.MAX: "max", ReduceOp.MIN: "min"},
)


def test_native_dtypes_and_average_as_sum_then_divide() -> None:
    plan = TABLE.lower(np.float32, ReduceOp.SUM)
    assert plan is not None and (plan.dtype, plan.op, plan.view, plan.divide, plan.factor) == ("F32", "sum", None,
                                                                                             False, 1)
    avg = TABLE.lower("float64", ReduceOp.AVG)
    assert avg is not None and (avg.op, avg.divide) == ("sum", True)
    assert TABLE.lower(np.float32, ReduceOp.SUM) is plan  # cached per (dtype, op)


def test_complex_reduces_as_float_pairs_for_sum_only() -> None:
    plan = TABLE.lower(np.complex128, ReduceOp.SUM)
    assert plan is not None and (plan.dtype, plan.view, plan.factor) == ("F64", np.dtype("f8"), 2)
    assert TABLE.lower(np.complex64, ReduceOp.MAX) is None
    assert "(real, imag) float pairs" in TABLE.why_not(np.complex64, ReduceOp.MAX)


def test_bool_travels_as_bytes_with_logical_ops() -> None:
    plan = TABLE.lower(np.bool_, ReduceOp.MAX)
    assert plan is not None and (plan.dtype, plan.op, plan.view) == ("U8", "max", np.dtype("u1"))
    assert TABLE.lower(np.bool_, ReduceOp.SUM) is None
    a = np.array([[True, False]])
    assert flat_view(a, plan.view).dtype == np.uint8 and flat_view(a, None).shape == (2,)


def test_an_unsupported_reduction_names_backend_op_dtype_and_device() -> None:
    with pytest.raises(UnsupportedOperationError,
                       match=r"all_reduce: backend 'demo' cannot apply SUM to dtype int16 on cuda: it reduces only"):
        TABLE.require(np.int16, ReduceOp.SUM, "all_reduce", device="cuda")
    assert TABLE.lower(np.dtype(">f4"), ReduceOp.SUM) is None  # byte-swapped arrays never reach a backend


@given(st.sampled_from(["bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32",
                        "float64", "complex64", "complex128"]), st.sampled_from(list(ReduceOp)))
def test_lower_and_why_not_agree(dtype: str, op: ReduceOp) -> None:
    plan = TABLE.lower(dtype, op)
    if plan is None:
        assert TABLE.why_not(dtype, op)
        with pytest.raises(UnsupportedOperationError):
            TABLE.require(dtype, op, "reduce")
    else:
        assert TABLE.require(dtype, op, "reduce") is plan


# ------------------------------------------------------------------ master-worker tags
@given(st.integers(0, 2**40))
def test_master_worker_tag_spaces_never_meet(n: int) -> None:
    reply, transfer = _protocol.reply_tag(n), _protocol.transfer_tag(n)
    for tag in (reply, transfer):
        assert _protocol.TAG_BASE <= tag < 2**31  # above every user tag, inside an int32
        assert tag < _protocol.TAG_BASE + (1 << 29) <= _protocol.data_tag(tag) < 2**31  # data beside frames
    assert reply not in (_protocol.CMD_TAG, _protocol.HELLO_TAG)
    assert reply < _protocol.TAG_BASE + (1 << 28) <= transfer
