"""RemoteArray: a NumPy-like handle of an array that lives on a worker node.

Every operation computes the result's shape and dtype here (:mod:`._meta`), so mistakes
raise NumPy's own exception at the call, then queues a command on the node's current
stream and returns at once. Only get()/np.asarray/float/int/bool and the explicit
synchronizations wait for the worker.

Each sync point has an awaitable form for asyncio (``await x.get_async()``): what depends
on the caller's thread (its current stream) is read on it, then the blocking wait runs on
the event loop's default executor, so the loop goes on meanwhile; errors and the group's
timeout are those of the blocking form.
"""

from __future__ import annotations

import asyncio
import inspect
import pickle
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from ..errors import InvalidArgumentError
from ..ops import ReduceOp
from . import _meta
from . import _protocol as P
from ._master import INLINE_SEND, SMALL_BYTES, Master, NodeLink, master
from ._meta import AbstractArray
from ._protocol import Command, Ref

_SCALARS = (bool, int, float, complex, str, type(None), np.generic, np.dtype, slice, type(Ellipsis), ReduceOp)


class RemoteArray(AbstractArray, NDArrayOperatorsMixin):
    """An array on node ``node`` (device -1: the worker's memory; k >= 0: its GPU k)."""

    __slots__ = ("__weakref__", "_device", "_id", "_master", "_node", "dtype", "shape")
    __array_priority__ = 1000

    def __init__(self, m: Master, node: int, device: int, shape: tuple[int, ...], dtype: np.dtype,
                 id_: int | None = None) -> None:
        self._master = m
        self._id = next(m.ids) if id_ is None else id_
        self._node = node
        self._device = device
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)

    def __del__(self) -> None:
        m = getattr(self, "_master", None)
        if m is not None and not m.closed:
            try:
                m.links[self._node].frees.append(self._id)  # lock-free: GC may run anywhere
            except Exception:  # noqa: BLE001 - never raise from a finalizer
                pass

    # ------------------------------------------------------------ metadata (no round trip)
    @property
    def node(self) -> int:
        return self._node

    @property
    def device(self) -> int:
        return self._device

    def get_node(self) -> int:
        return self._node

    def get_device(self) -> int:
        return self._device

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def T(self) -> RemoteArray:
        return self.transpose()

    def __repr__(self) -> str:
        where = "cpu" if self._device < 0 else f"cuda:{self._device}"
        return f"RemoteArray(shape={self.shape}, dtype={self.dtype}, node={self._node}, device={self._device} ({where}))"

    __hash__ = None  # type: ignore[assignment]  # mutable, so unhashable, as ndarray is

    # ------------------------------------------------------------ sync points
    def get(self) -> np.ndarray:
        """Copy the data to the master (waits for the ops it depends on)."""
        return self._fetch(self._master.stream_id(self._node))

    async def get_async(self) -> np.ndarray:
        """:meth:`get` for asyncio: ``await x.get_async()`` waits without blocking the
        event loop (on the caller's current stream, like get())."""
        return await in_executor(self._fetch, self._master.stream_id(self._node))

    def _fetch(self, sid: int) -> np.ndarray:
        m = self._master
        link = m.link(self._node)
        small = self.nbytes <= SMALL_BYTES
        return link.get_array(lambda tag, posted: (Command.GET_ARRAY.value, sid, (), (), small, (Ref(self._id), tag, posted)),
                              self.shape, self.dtype, "get")

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.get()
        return a if dtype is None else a.astype(dtype, copy=False)

    def _scalar(self, conv: Callable[[Any], Any]) -> Any:
        if self.size != 1:
            conv(_meta.ghost(self))  # NumPy's own error (only size-1 arrays convert)
        return conv(self.get())

    def __float__(self) -> float:
        return self._scalar(float)

    def __int__(self) -> int:
        return self._scalar(int)

    def __complex__(self) -> complex:
        return self._scalar(complex)

    def __bool__(self) -> bool:
        return self._scalar(bool)

    def item(self) -> Any:
        return self._scalar(lambda a: a.item())

    def tolist(self) -> Any:
        return self.get().tolist()

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self) -> Iterator[RemoteArray]:
        for i in range(len(self)):
            yield self[i]

    # ------------------------------------------------------------ NumPy protocols
    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if method not in ("__call__", "reduce", "accumulate"):
            return NotImplemented
        out = kwargs.get("out")
        if out is not None:
            out = out if isinstance(out, tuple) else (out,)
            for o in out:
                if o is not None and not isinstance(o, RemoteArray):
                    raise TypeError(f"{ufunc.__name__}: out= must be RemoteArrays when an operand is remote "
                                    f"(got {type(o).__name__}); use .get() to compute locally")
            kwargs["out"] = out
        for x in inputs:
            if not isinstance(x, (RemoteArray, np.ndarray) + _SCALARS):
                return NotImplemented
        operands = list(inputs) + [o for o in (out or ()) if o is not None]
        if isinstance(kwargs.get("where"), RemoteArray):
            operands.append(kwargs["where"])
        m, link, device = _placement(operands, ufunc.__name__)
        if method == "__call__":
            shape, dtypes = _meta.ufunc_call(ufunc, inputs, kwargs)
        else:
            if len(inputs) != 1 or not isinstance(inputs[0], RemoteArray):
                return NotImplemented
            shape, dtype = _meta.ufunc_reduce(ufunc, method, inputs[0], kwargs)
            dtypes = (dtype,)
        if out is not None:
            results = tuple(out)
            new: tuple[RemoteArray, ...] = ()
        else:
            new = tuple(RemoteArray(m, link.node, device, shape, dt) for dt in dtypes)
            results = new
        wk = dict(kwargs)
        if out is not None:
            wk["out"] = _conv(out[0], link.node, device) if len(out) == 1 else _conv(out, link.node, device)
        nbytes = _bytes(operands) + sum(r.nbytes for r in results)
        _issue(m, link, Command.UFUNC.value, new, tuple(Ref(o._id) for o in (out or ()) if o is not None),
               nbytes <= SMALL_BYTES,
               (ufunc.__name__, method, _conv(list(inputs), link.node, device), _conv(wk, link.node, device), device))
        return results[0] if len(results) == 1 else results

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        handler = FUNCTIONS.get(func)
        if handler is None:
            name = getattr(func, "__name__", repr(func))
            raise TypeError(f"procgroup.remote: np.{name} is not supported on RemoteArray (supported: "
                            f"{', '.join(sorted(f.__name__ for f in FUNCTIONS))}); use .get() for a local "
                            f"copy, or remote.run() to run any function on the worker")
        return handler(*args, **kwargs)

    # ------------------------------------------------------------ indexing
    def __getitem__(self, key: Any) -> RemoteArray:
        shape, dtype = _meta.getitem(self, key)
        m, link, device = _placement([self] + _key_remotes(key), "getitem")
        out = RemoteArray(m, link.node, device, shape, dtype)
        _issue(m, link, Command.GET_ITEM.value, (out,), (), out.nbytes <= SMALL_BYTES,
               (Ref(self._id), _conv(key, link.node, device), device))
        return out

    def __setitem__(self, key: Any, value: Any) -> None:
        if not isinstance(value, (RemoteArray, np.ndarray) + _SCALARS):
            value = np.asarray(value)
        _meta.setitem(self, key, value)
        m, link, device = _placement([self, value] + _key_remotes(key), "setitem")
        _issue(m, link, Command.SET_ITEM.value, (), (Ref(self._id),), self.nbytes <= SMALL_BYTES,
               (Ref(self._id), _conv(key, link.node, device), _conv(value, link.node, device), device))

    # ------------------------------------------------------------ methods
    def astype(self, dtype: Any, copy: bool = True) -> RemoteArray:
        dt = _meta.astype(self, dtype)
        if not copy and dt == self.dtype:
            return self
        return _method(self, "astype", (dt.str,), {}, self.shape, dt)

    def copy(self) -> RemoteArray:
        return _method(self, "copy", (), {}, self.shape, self.dtype)

    def fill(self, value: Any) -> None:
        _meta.setitem(self, Ellipsis, value)
        m, link, device = _placement([self], "fill")
        _issue(m, link, Command.METHOD.value, (), (Ref(self._id),), self.nbytes <= SMALL_BYTES,
               ("fill", Ref(self._id), (_conv(value, link.node, device),), {}, device))

    def reshape(self, *shape: Any, order: str = "C") -> RemoteArray:
        if len(shape) == 1:
            shape = shape[0]
        return _view_func(np.reshape, self, (shape,), {"order": order} if order != "C" else {})

    def transpose(self, *axes: Any) -> RemoteArray:
        order: Any = axes[0] if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], (tuple, list))) else axes
        return _view_func(np.transpose, self, (), {"axes": tuple(order)} if order else {})

    def ravel(self) -> RemoteArray:
        return _dispatch(np.ravel, self)

    def flatten(self) -> RemoteArray:
        return _method(self, "flatten", (), {}, (self.size,), self.dtype)

    def squeeze(self, axis: Any = None) -> RemoteArray:
        return _dispatch(np.squeeze, self, axis=axis)

    def swapaxes(self, a: int, b: int) -> RemoteArray:
        return _dispatch(np.swapaxes, self, a, b)

    def dot(self, b: Any) -> RemoteArray:
        return _dispatch(np.dot, self, b)

    def clip(self, min: Any = None, max: Any = None) -> RemoteArray:
        return _dispatch(np.clip, self, min, max)

    def round(self, decimals: int = 0) -> RemoteArray:
        return _dispatch(np.round, self, decimals)

    def sum(self, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> RemoteArray:
        return _dispatch(np.sum, self, axis=axis, dtype=dtype, keepdims=keepdims)

    def prod(self, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> RemoteArray:
        return _dispatch(np.prod, self, axis=axis, dtype=dtype, keepdims=keepdims)

    def mean(self, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> RemoteArray:
        return _dispatch(np.mean, self, axis=axis, dtype=dtype, keepdims=keepdims)

    def std(self, axis: Any = None, dtype: Any = None, ddof: int = 0, keepdims: bool = False) -> RemoteArray:
        return _dispatch(np.std, self, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims)

    def var(self, axis: Any = None, dtype: Any = None, ddof: int = 0, keepdims: bool = False) -> RemoteArray:
        return _dispatch(np.var, self, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims)

    def max(self, axis: Any = None, keepdims: bool = False) -> RemoteArray:
        return _dispatch(np.max, self, axis=axis, keepdims=keepdims)

    def min(self, axis: Any = None, keepdims: bool = False) -> RemoteArray:
        return _dispatch(np.min, self, axis=axis, keepdims=keepdims)

    def any(self, axis: Any = None, keepdims: bool = False) -> RemoteArray:
        return _dispatch(np.any, self, axis=axis, keepdims=keepdims)

    def all(self, axis: Any = None, keepdims: bool = False) -> RemoteArray:
        return _dispatch(np.all, self, axis=axis, keepdims=keepdims)

    def argmax(self, axis: Any = None) -> RemoteArray:
        return _dispatch(np.argmax, self, axis=axis)

    def argmin(self, axis: Any = None) -> RemoteArray:
        return _dispatch(np.argmin, self, axis=axis)

    def cumsum(self, axis: Any = None, dtype: Any = None) -> RemoteArray:
        return _dispatch(np.cumsum, self, axis=axis, dtype=dtype)

    # ------------------------------------------------------------ moving
    def to(self, node: int | None = None, device: int | None = None) -> RemoteArray:
        """A copy on ``node`` (default: this one) and ``device`` (default: this one);
        between nodes the data goes worker to worker. Returns self when nothing changes."""
        m = self._master
        dst = m.link(self._node if node is None else node)
        device = self._device if device is None else _device_arg(device)
        dst.check_device(device)
        if dst.node == self._node and device == self._device:
            return self
        src = m.link(self._node)
        out = RemoteArray(m, dst.node, device, self.shape, self.dtype)
        if dst.node == self._node:
            _issue(m, src, Command.TO_DEVICE.value, (out,), (), False, (Ref(self._id), device))
            src.flush()
            return out
        tag = P.transfer_tag(next(m.transfers))
        # both go at once from this thread (waking the flusher for them would only make it
        # compete for the GIL on the copy's critical path); the receiver's first, so that its
        # READY (posted) or its wait for the sender's frame is under way when the sender starts
        posted = P.posts(m.channel, self.nbytes)
        dst.issue_now((Command.RECV_FROM.value, m.stream_id(dst.node), ((out._id, out.shape, out.dtype.str),), (), False,
                       (self.shape, self.dtype.str, device, src.rank, tag, posted)))
        src.issue_now((Command.SEND_TO.value, m.stream_id(src.node), (), (), False, (Ref(self._id), dst.rank, tag, posted)))
        return out

    def cuda(self, device: int = 0) -> RemoteArray:
        return self.to(self._node, device)

    def cpu(self) -> RemoteArray:
        return self.to(self._node, -1)


class RemoteValue:
    """What remote.run returned when it was not an array; .get() fetches it (pickled)."""

    __slots__ = ("__weakref__", "_id", "_master", "_node")

    def __init__(self, m: Master, node: int, id_: int) -> None:
        self._master, self._node, self._id = m, node, id_

    @property
    def node(self) -> int:
        return self._node

    def get(self) -> Any:
        """Wait for the function and return its result."""
        return self._fetch(self._master.stream_id(self._node))

    async def get_async(self) -> Any:
        """:meth:`get` for asyncio: ``await v.get_async()`` waits without blocking the loop."""
        return await in_executor(self._fetch, self._master.stream_id(self._node))

    def _fetch(self, sid: int) -> Any:
        link = self._master.link(self._node)
        return link.request(lambda tag: (Command.GET_VALUE.value, sid, (), (), True, (Ref(self._id), tag)), "RemoteValue.get")

    def __del__(self) -> None:
        m = getattr(self, "_master", None)
        if m is not None and not m.closed:
            try:
                m.links[self._node].frees.append(self._id)
            except Exception:  # noqa: BLE001 - never raise from a finalizer
                pass

    def __repr__(self) -> str:
        return f"RemoteValue(node={self._node})"


# --------------------------------------------------------------------- helpers
async def in_executor(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on the running loop's default executor: a sync point's blocking wait,
    awaited without blocking the loop (its error is raised at the await)."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def _device_arg(device: Any) -> int:
    if isinstance(device, bool) or not isinstance(device, (int, np.integer)) or device < -1:
        raise InvalidArgumentError(f"device must be -1 (the worker's memory) or a GPU index >= 0, got {device!r}")
    return int(device)


def _walk(obj: Any) -> Iterator[Any]:
    if isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _walk(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _walk(o)
    else:
        yield obj


def _key_remotes(key: Any) -> list[Any]:
    return [k for k in _walk(key if isinstance(key, tuple) else (key,)) if isinstance(k, RemoteArray)]


def _placement(operands: Sequence[Any], op: str, node: int | None = None) -> tuple[Master, NodeLink, int]:
    """The node and device every remote operand shares (a clear error when they differ)."""
    first: RemoteArray | None = None
    for x in operands:
        if isinstance(x, RemoteArray):
            if first is None:
                first = x
            elif x._node != first._node:
                raise InvalidArgumentError(
                    f"{op}: operands are on different nodes (node {first._node} and node {x._node}); move one "
                    f"with .to(node) first")
            elif x._device != first._device:
                raise InvalidArgumentError(
                    f"{op}: operands are on different devices of node {x._node} (device {first._device} and "
                    f"device {x._device}); move one with .cuda(k) or .cpu() first")
    if first is None:
        m = master()
        return m, m.link(node), -1
    m = first._master
    return m, m.link(first._node), first._device


def _conv(obj: Any, node: int, device: int) -> Any:
    """Command arguments: RemoteArrays become Refs; only plain data travels."""
    if isinstance(obj, RemoteArray):
        return Ref(obj._id)
    if type(obj) is Ref:
        return obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(_conv(o, node, device) for o in obj)
    if isinstance(obj, dict):
        return {k: _conv(v, node, device) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biufcmM":
            raise TypeError(f"procgroup.remote: local arrays of dtype {obj.dtype} cannot be sent")
        return obj
    if isinstance(obj, _SCALARS):
        return obj
    raise TypeError(f"procgroup.remote: an argument of type {type(obj).__name__} cannot be sent to a worker "
                    f"(scalars, NumPy arrays, strings, slices, dtypes and RemoteArrays can)")


def _bytes(operands: Sequence[Any]) -> int:
    return sum(x.nbytes for x in operands if isinstance(x, (RemoteArray, np.ndarray)))


def _issue(m: Master, link: NodeLink, kind: str, outs: Sequence[RemoteArray], writes: tuple[Ref, ...],
           small: bool, args: Any) -> None:
    link.issue((kind, m.stream_id(link.node), tuple((o._id, o.shape, o.dtype.str) for o in outs), writes, small,
                args))


def _method(x: RemoteArray, name: str, margs: tuple[Any, ...], mkwargs: dict[str, Any],
            shape: tuple[int, ...], dtype: np.dtype) -> RemoteArray:
    m, link, device = _placement([x], name)
    out = RemoteArray(m, link.node, device, shape, dtype)
    _issue(m, link, Command.METHOD.value, (out,), (), x.nbytes + out.nbytes <= SMALL_BYTES,
           (name, Ref(x._id), _conv(margs, link.node, device), _conv(mkwargs, link.node, device), device))
    return out


def _func(name: str, operands: Sequence[Any], fargs: tuple[Any, ...], fkwargs: dict[str, Any],
          shape: tuple[int, ...], dtype: np.dtype, node: int | None = None, device: int | None = None) -> RemoteArray:
    m, link, dev = _placement(operands, name, node)
    if device is not None:
        dev = device
    out = RemoteArray(m, link.node, dev, shape, dtype)
    _issue(m, link, Command.FUNCTION.value, (out,), (), _bytes(operands) + out.nbytes <= SMALL_BYTES,
           (name, _conv(fargs, link.node, dev), _conv(fkwargs, link.node, dev), dev))
    return out


def _dispatch(func: Callable[..., Any], *args: Any, **kwargs: Any) -> RemoteArray:
    """NumPy function ``func`` called on a RemoteArray: NumPy hands the call to
    RemoteArray.__array_function__, so the result is one (NumPy's stubs cannot say so)."""
    result: RemoteArray = func(*args, **kwargs)
    return result


def _view_func(func: Any, x: RemoteArray, args: tuple[Any, ...], kwargs: dict[str, Any]) -> RemoteArray:
    shape, dtype = _meta.on_ghosts(func, (x,) + tuple(args), kwargs)
    return _func(func.__name__, [x], (x,) + tuple(args), kwargs, shape, dtype)


_SIGS: dict[Any, inspect.Signature] = {}


def _bind(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    sig = _SIGS.get(func)
    if sig is None:
        sig = _SIGS[func] = inspect.signature(func)
    bound = sig.bind(*args, **kwargs)
    return dict(bound.arguments)


# --------------------------------------------------------------------- __array_function__ table
FUNCTIONS: dict[Any, Callable[..., Any]] = {}


def _implements(*funcs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def deco(handler: Callable[..., Any]) -> Callable[..., Any]:
        for f in funcs:
            FUNCTIONS[f] = handler
        return handler

    return deco


def _reduction_handler(func: Any) -> Callable[..., Any]:
    def handler(*args: Any, **kwargs: Any) -> RemoteArray:
        ba = _bind(func, args, kwargs)
        a = ba.pop("a")
        if ba.get("out") is not None:
            raise TypeError(f"np.{func.__name__}: out= is not supported on RemoteArray")
        ba.pop("out", None)
        kw = {k: v for k, v in ba.items() if not _is_novalue(v)}
        if "dtype" in kw and kw["dtype"] is not None:
            kw["dtype"] = np.dtype(kw["dtype"]).str
        if not isinstance(a, RemoteArray):
            raise TypeError(f"np.{func.__name__}: RemoteArray operands only in the first argument")
        shape, dtype = _meta.reduction(func, a, kw)
        return _func(func.__name__, [a], (a,), kw, shape, dtype)

    return handler


def _is_novalue(v: Any) -> bool:
    return type(v).__name__ == "_NoValueType"


for _f in (np.sum, np.prod, np.mean, np.std, np.var, np.max, np.min, np.amax, np.amin, np.any, np.all,
           np.argmax, np.argmin, np.cumsum, np.cumprod, np.nansum, np.nanmean, np.nanmax, np.nanmin, np.ptp):
    FUNCTIONS[_f] = _reduction_handler(_f)


def _view_handler(func: Any) -> Callable[..., Any]:
    def handler(*args: Any, **kwargs: Any) -> RemoteArray:
        if not isinstance(args[0], RemoteArray):
            raise TypeError(f"np.{func.__name__}: the array must be a RemoteArray")
        return _view_func(func, args[0], tuple(args[1:]), kwargs)

    return handler


_VIEWS: tuple[Callable[..., Any], ...] = (
    np.reshape, np.transpose, np.squeeze, np.expand_dims, np.swapaxes, np.moveaxis, np.broadcast_to,
    np.flip, np.atleast_1d, np.atleast_2d, np.atleast_3d)
for _f in _VIEWS:
    FUNCTIONS[_f] = _view_handler(_f)


@_implements(np.ravel)
def _ravel(a: RemoteArray, order: str = "C") -> RemoteArray:
    return _func("ravel", [a], (a,), {"order": order} if order != "C" else {}, (a.size,), a.dtype)


@_implements(np.copy)
def _copy(a: RemoteArray, order: str = "K", subok: bool = False) -> RemoteArray:
    return a.copy()


@_implements(np.shape)
def _shape(a: Any) -> tuple[int, ...]:
    return a.shape


@_implements(np.ndim)
def _ndim(a: Any) -> int:
    return a.ndim


@_implements(np.size)
def _size(a: Any, axis: Any = None) -> int:
    return a.size if axis is None else a.shape[axis]


@_implements(np.concatenate)
def _concatenate(arrays: Sequence[Any], axis: Any = 0, out: Any = None, dtype: Any = None,
                 casting: str = "same_kind") -> RemoteArray:
    if out is not None:
        raise TypeError("np.concatenate: out= is not supported on RemoteArray")
    arrays = list(arrays)
    shape, dt = _meta.concatenate(arrays, axis, dtype, casting)
    kw: dict[str, Any] = {"axis": axis}
    if dtype is not None:
        kw["dtype"] = np.dtype(dtype).str
    if casting != "same_kind":
        kw["casting"] = casting
    return _func("concatenate", arrays, (arrays,), kw, shape, dt)


@_implements(np.stack)
def _stack(arrays: Sequence[Any], axis: int = 0, out: Any = None, **kwargs: Any) -> RemoteArray:
    if out is not None:
        raise TypeError("np.stack: out= is not supported on RemoteArray")
    arrays = list(arrays)
    shape, dt = _meta.concatenate(arrays, axis, kwargs.get("dtype"), kwargs.get("casting", "same_kind"), stack=True)
    return _func("stack", arrays, (arrays,), {"axis": axis, **kwargs}, shape, dt)


@_implements(np.where)
def _where(condition: Any, *xy: Any) -> RemoteArray:
    if len(xy) != 2:
        raise TypeError("np.where(condition) (the indices of non-zero elements) has a data-dependent shape and is "
                        "not supported on RemoteArray; use np.where(condition, x, y), or .get() first")
    operands = [condition, *xy]
    shape, dt = _meta.broadcast_meta(np.where, operands, {})
    return _func("where", operands, tuple(operands), {}, shape, dt)


@_implements(np.clip)
def _clip(a: Any, a_min: Any = None, a_max: Any = None, out: Any = None, **kwargs: Any) -> RemoteArray:
    if out is not None:
        raise TypeError("np.clip: out= is not supported on RemoteArray; use x[...] = np.clip(...)")
    a_min = kwargs.pop("min", a_min)
    a_max = kwargs.pop("max", a_max)
    if kwargs:
        raise TypeError(f"np.clip: unsupported arguments {sorted(kwargs)} on RemoteArray")
    operands = [a, a_min, a_max]
    shape, dt = _meta.broadcast_meta(np.clip, operands, {})
    return _func("clip", operands, tuple(operands), {}, shape, dt)


@_implements(np.dot)
def _dot(a: Any, b: Any, out: Any = None) -> RemoteArray:
    if out is not None:
        raise TypeError("np.dot: out= is not supported on RemoteArray")
    shape, dt = _meta.dot(a, b)
    return _func("dot", [a, b], (a, b), {}, shape, dt)


@_implements(np.outer)
def _outer(a: Any, b: Any, out: Any = None) -> RemoteArray:
    if out is not None:
        raise TypeError("np.outer: out= is not supported on RemoteArray")
    shape, dt = _meta.outer(a, b)
    return _func("outer", [a, b], (a, b), {}, shape, dt)


@_implements(np.round, np.around)
def _round(a: Any, decimals: int = 0, out: Any = None) -> RemoteArray:
    if out is not None:
        raise TypeError("np.round: out= is not supported on RemoteArray")
    dt = np.round(np.ones(1, a.dtype), decimals).dtype
    return _func("round", [a], (a, decimals), {}, a.shape, dt)


@_implements(np.allclose)
def _allclose(a: Any, b: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:
    np.allclose(_meta.tiny(a), _meta.tiny(b), rtol, atol, equal_nan)  # NumPy's type errors
    try:
        np.broadcast_shapes(_meta.shape_of(a), _meta.shape_of(b))
    except ValueError:
        np.allclose(_meta.ghost(a), _meta.ghost(b))
        raise
    return bool(_func("allclose", [a, b], (a, b, rtol, atol, equal_nan), {}, (), np.dtype(bool)))


@_implements(np.array_equal)
def _array_equal(a1: Any, a2: Any, equal_nan: bool = False) -> bool:
    return bool(_func("array_equal", [a1, a2], (a1, a2), {"equal_nan": equal_nan}, (), np.dtype(bool)))


def pickled_function(fn: Any) -> bytes:
    try:
        return pickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise TypeError(f"remote.run: {fn!r} cannot be pickled ({exc}); define it at module level in a module the "
                        f"workers can import (or in the script, before init_master_worker)") from exc


__all__ = ["FUNCTIONS", "INLINE_SEND", "RemoteArray", "RemoteValue", "pickled_function"]
