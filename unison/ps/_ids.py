"""Which ids a table takes: integers that fit in int64, checked on the trainer before anything is sent.

A row is found by its id's exact value, so an id must be an integer: a float id such as 1.7 would
read row 1 after a cast, NaN some arbitrary row, and the uint64 ``2**64 - 1`` would wrap to -1. Any
integer dtype is taken when every value fits in int64 (so uint64 ids are fine up to ``2**63 - 1``);
floats (even 1.0), booleans, complex numbers, strings and objects are refused, naming the table,
the dtype and the first value that is refused. An empty batch is taken whatever its dtype
(``np.array([])`` is float64): it has no value to misread.

Example:
    >>> table_ids("emb", np.array([3, 7], np.uint8)).dtype
    dtype('int64')
    >>> table_ids("emb", np.array([1.0, 1.7]))
    Traceback (most recent call last):
    ...
    unison.errors.RequestError: ids of table 'emb' must be integers (any int64 value); nothing was sent. Got dtype float64, for example 1.7. Pass integer ids: ids.astype(np.int64) where they are whole numbers, else fix what makes them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import RequestError

__all__ = ["table_ids"]

_INT64_MAX = np.iinfo(np.int64).max


_FIX_FLOAT = "Pass integer ids: ids.astype(np.int64) where they are whole numbers, else fix what makes them."
_FIX_UINT64 = "Map them into int64 one to one, e.g. with ids.view(np.int64)."
_FIX_OTHER = "Pass integer ids (a NumPy array or tensor of an integer dtype)."


def _refuse(table: str, dtype: object, example: object, fix: str, why: str = "") -> RequestError:
    return RequestError(f"ids of table {table!r} must be integers (any int64 value); nothing was sent. Got dtype "
                        f"{dtype}, for example {example!r}{why}. {fix}")


def table_ids(table: str, ids: Any, dtype_name: str | None = None) -> np.ndarray:
    """`ids` as an int64 array of the same shape, or `RequestError` naming `table`, the dtype and a value.

    Args:
        table: the table's name, for the message.
        ids: an array, a tensor converted to NumPy, a list or a scalar.
        dtype_name: the dtype to name in a refusal when `ids` was converted on the way here (a torch
            bfloat16 tensor reaches NumPy as float32); default: the array's own.
    """
    try:
        array = np.asarray(ids)
    except (ValueError, TypeError, OverflowError) as exc:
        raise RequestError(f"ids of table {table!r} must be an array of integers (any int64 value); "
                           f"{type(ids).__name__} could not be read as one ({exc}); nothing was sent. Pass a "
                           "NumPy array, a tensor or a list of integers.") from None
    if array.size == 0:
        return array.astype(np.int64)
    shown = array.dtype if dtype_name is None else dtype_name
    kind = array.dtype.kind
    if kind == "i":
        return array.astype(np.int64, copy=False)
    if kind == "u":
        if array.dtype.itemsize < 8:
            return array.astype(np.int64)
        over = np.flatnonzero(array.reshape(-1) > _INT64_MAX)
        if len(over):
            raise _refuse(table, shown, int(array.reshape(-1)[over[0]]), _FIX_UINT64,
                          f" (over 2**63 - 1, so it does not fit in int64; {len(over)} of {array.size} ids are)")
        return array.astype(np.int64)
    if kind == "O":
        values = array.reshape(-1).tolist()
        bad = next((v for v in values if not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_))
                    or not -_INT64_MAX - 1 <= int(v) <= _INT64_MAX), None)
        if bad is None:
            return np.array(values, dtype=np.int64).reshape(array.shape)
        outside = isinstance(bad, int) and not isinstance(bad, bool)
        raise _refuse(table, f"object ({type(bad).__name__} values)", bad, _FIX_UINT64 if outside else _FIX_OTHER,
                      " (outside int64)" if outside else "")
    flat = array.reshape(-1)
    example = flat[0]
    if kind == "f":  # the first value that is not a whole number says most
        with np.errstate(invalid="ignore"):
            odd = np.flatnonzero(~np.isfinite(flat) | (flat != np.floor(flat)))
        example = flat[odd[0]] if len(odd) else example
    raise _refuse(table, shown, example.item(), _FIX_FLOAT if kind == "f" else _FIX_OTHER)
