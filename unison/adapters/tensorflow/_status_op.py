"""A graph op that fails with a chosen `tf.errors` code and message: how graph-mode collectives report errors.

A collective in a graph runs in a Python kernel (numpy_function), and TensorFlow turns an exception
raised there into InvalidArgument, Unimplemented or Unknown only; no stock kernel fails with a code
and a message taken from its input. So the Python kernel does not raise: it files the error under a
number and outputs that number, and ``UnisonCollectiveStatus`` (this module's op, input
``error_id: int64``, no outputs) fails with the error's code and message when the number is not 0.
The collective's outputs are read through a control dependency on it, so a failed collective raises
the same `tf.errors` class in ``Session.run`` and `tf.function` as it does eagerly.

The op and its CPU kernel are registered through TensorFlow's C API for plugin kernels
(``tensorflow/c/ops.h`` and ``kernels.h``, exported by ``libtensorflow_framework``), called with
ctypes: nothing is compiled. If the library or a symbol is missing, `available()` is False and the
bridge lets the exception propagate as before (Unknown in a graph).
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import os
import threading
from typing import TypedDict

import tensorflow as tf

__all__ = ["OP_TYPE", "available", "check", "file_error"]

OP_TYPE = "UnisonCollectiveStatus"

logger = logging.getLogger(__name__)

_P = ctypes.c_void_p
_SHAPE_FN = ctypes.CFUNCTYPE(None, _P, _P)
_CREATE = ctypes.CFUNCTYPE(_P, _P)
_COMPUTE = ctypes.CFUNCTYPE(None, _P, _P)
_DELETE = ctypes.CFUNCTYPE(None, _P)

_UNKNOWN = 2  # TF_UNKNOWN
_INTERNAL = 13  # TF_INTERNAL

# error id -> (tf error code, message); filed by the Python kernel, taken by the status op
_filed: dict[int, tuple[int, str]] = {}
_ids = itertools.count(1)
_lock = threading.Lock()


class _State(TypedDict, total=False):
    ok: bool  # set once registration was tried
    keep: tuple[object, ...]  # the ctypes callbacks, kept alive for TensorFlow


_state: _State = {}


def file_error(code: int, message: str) -> int:
    """Keep (code, message) for the status op; return the id the Python kernel outputs."""
    error_id = next(_ids)
    _filed[error_id] = (int(code), message)
    return error_id


def _library() -> ctypes.CDLL:
    lib = ctypes.CDLL(os.path.join(tf.sysconfig.get_lib(), "libtensorflow_framework.so.2"))
    lib.TF_NewStatus.restype = _P
    lib.TF_DeleteStatus.argtypes = [_P]
    lib.TF_GetCode.argtypes = [_P]
    lib.TF_Message.argtypes = [_P]
    lib.TF_Message.restype = ctypes.c_char_p
    lib.TF_SetStatus.argtypes = [_P, ctypes.c_int, ctypes.c_char_p]
    lib.TF_NewOpDefinitionBuilder.restype = _P
    lib.TF_NewOpDefinitionBuilder.argtypes = [ctypes.c_char_p]
    lib.TF_OpDefinitionBuilderAddInput.argtypes = [_P, ctypes.c_char_p]
    lib.TF_OpDefinitionBuilderSetIsStateful.argtypes = [_P, ctypes.c_bool]
    lib.TF_OpDefinitionBuilderSetShapeInferenceFunction.argtypes = [_P, _SHAPE_FN]
    lib.TF_RegisterOpDefinition.argtypes = [_P, _P]
    lib.TF_NewKernelBuilder.restype = _P
    lib.TF_NewKernelBuilder.argtypes = [ctypes.c_char_p, ctypes.c_char_p, _CREATE, _COMPUTE, _DELETE]
    lib.TF_RegisterKernelBuilder.argtypes = [ctypes.c_char_p, _P, _P]
    lib.TF_GetInput.argtypes = [_P, ctypes.c_int, ctypes.POINTER(_P), _P]
    lib.TF_TensorData.restype = _P
    lib.TF_TensorData.argtypes = [_P]
    lib.TF_DeleteTensor.argtypes = [_P]
    lib.TF_OpKernelContext_Failure.argtypes = [_P, _P]
    return lib


def _register() -> bool:
    """Register the op and its CPU kernel once per process; False (logged) if TensorFlow lacks the C API."""
    try:
        lib = _library()
    except (OSError, AttributeError) as error:
        logger.debug("graph-mode error codes unavailable (%s): failures surface as UnknownError", error)
        return False

    def compute(_kernel: int | None, context: int | None) -> None:
        status = lib.TF_NewStatus()
        try:
            tensor = _P()
            lib.TF_GetInput(context, 0, ctypes.byref(tensor), status)
            if lib.TF_GetCode(status) == 0:
                error_id = ctypes.cast(lib.TF_TensorData(tensor), ctypes.POINTER(ctypes.c_int64))[0]
                lib.TF_DeleteTensor(tensor)
                if error_id:
                    code, message = _filed.pop(error_id, (_UNKNOWN, f"collective error {error_id} was lost"))
                    lib.TF_SetStatus(status, code, message.encode("utf-8", "replace"))
        except Exception as error:  # a ctypes callback must not raise: report it as the op's failure
            lib.TF_SetStatus(status, _INTERNAL, f"{OP_TYPE} failed: {error!r}".encode())
        if lib.TF_GetCode(status) != 0:
            lib.TF_OpKernelContext_Failure(context, status)
        lib.TF_DeleteStatus(status)

    # TensorFlow keeps these function pointers for the life of the process; so must Python.
    keep = (_SHAPE_FN(lambda _context, _status: None), _CREATE(lambda _construction: None),
            _COMPUTE(compute), _DELETE(lambda _kernel: None))
    status = lib.TF_NewStatus()
    try:
        builder = lib.TF_NewOpDefinitionBuilder(OP_TYPE.encode())
        lib.TF_OpDefinitionBuilderAddInput(builder, b"error_id: int64")
        lib.TF_OpDefinitionBuilderSetIsStateful(builder, True)
        lib.TF_OpDefinitionBuilderSetShapeInferenceFunction(builder, keep[0])
        lib.TF_RegisterOpDefinition(builder, status)
        if lib.TF_GetCode(status) == 0:
            kernel = lib.TF_NewKernelBuilder(OP_TYPE.encode(), b"CPU", keep[1], keep[2], keep[3])
            lib.TF_RegisterKernelBuilder(OP_TYPE.encode(), kernel, status)
        if lib.TF_GetCode(status) != 0:
            logger.debug("registering %s failed: %s", OP_TYPE, lib.TF_Message(status))
            return False
    finally:
        lib.TF_DeleteStatus(status)
    _state["keep"] = keep
    return True


def available() -> bool:
    """True when the status op is registered (registering it on first use)."""
    with _lock:
        if "ok" not in _state:
            _state["ok"] = _register()
        return bool(_state["ok"])


def check(error_id: tf.Tensor, name: str) -> tf.Operation:
    """The op that fails with the error filed under `error_id` (a scalar int64), or does nothing for 0."""
    with tf.device("/device:CPU:0"):
        return tf.compat.v1.get_default_graph().create_op(OP_TYPE, [error_id], [], name=name)
