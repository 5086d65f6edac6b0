from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TrainerInfo(_message.Message):
    __slots__ = ("trainer", "num_trainers", "host", "pid", "version", "mode")
    TRAINER_FIELD_NUMBER: _ClassVar[int]
    NUM_TRAINERS_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    trainer: int
    num_trainers: int
    host: str
    pid: int
    version: str
    mode: str
    def __init__(self, trainer: _Optional[int] = ..., num_trainers: _Optional[int] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., version: _Optional[str] = ..., mode: _Optional[str] = ...) -> None: ...

class HelloReply(_message.Message):
    __slots__ = ("server", "num_servers", "mode", "version", "restored", "incarnation", "sequence")
    SERVER_FIELD_NUMBER: _ClassVar[int]
    NUM_SERVERS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RESTORED_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    server: int
    num_servers: int
    mode: str
    version: int
    restored: bool
    incarnation: int
    sequence: int
    def __init__(self, server: _Optional[int] = ..., num_servers: _Optional[int] = ..., mode: _Optional[str] = ..., version: _Optional[int] = ..., restored: _Optional[bool] = ..., incarnation: _Optional[int] = ..., sequence: _Optional[int] = ...) -> None: ...

class Optimizer(_message.Message):
    __slots__ = ("kind", "fields")
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    fields: _containers.ScalarMap[str, float]
    def __init__(self, kind: _Optional[str] = ..., fields: _Optional[_Mapping[str, float]] = ...) -> None: ...

class DenseDecl(_message.Message):
    __slots__ = ("key", "size")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    key: str
    size: int
    def __init__(self, key: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...

class TableDecl(_message.Message):
    __slots__ = ("name", "dim", "capacity", "initializer", "scale", "seed", "declared")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    INITIALIZER_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    DECLARED_FIELD_NUMBER: _ClassVar[int]
    name: str
    dim: int
    capacity: int
    initializer: str
    scale: float
    seed: int
    declared: int
    def __init__(self, name: _Optional[str] = ..., dim: _Optional[int] = ..., capacity: _Optional[int] = ..., initializer: _Optional[str] = ..., scale: _Optional[float] = ..., seed: _Optional[int] = ..., declared: _Optional[int] = ...) -> None: ...

class Piece(_message.Message):
    __slots__ = ("key", "offset", "ids", "data")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    key: str
    offset: int
    ids: bytes
    data: bytes
    def __init__(self, key: _Optional[str] = ..., offset: _Optional[int] = ..., ids: _Optional[bytes] = ..., data: _Optional[bytes] = ...) -> None: ...

class Frame(_message.Message):
    __slots__ = ("trainer", "step", "based_on", "dense", "tables", "optimizer", "pieces", "keys", "sequence", "incarnation")
    TRAINER_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    BASED_ON_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    PIECES_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    trainer: int
    step: int
    based_on: int
    dense: _containers.RepeatedCompositeFieldContainer[DenseDecl]
    tables: _containers.RepeatedCompositeFieldContainer[TableDecl]
    optimizer: Optimizer
    pieces: _containers.RepeatedCompositeFieldContainer[Piece]
    keys: _containers.RepeatedScalarFieldContainer[str]
    sequence: int
    incarnation: int
    def __init__(self, trainer: _Optional[int] = ..., step: _Optional[int] = ..., based_on: _Optional[int] = ..., dense: _Optional[_Iterable[_Union[DenseDecl, _Mapping]]] = ..., tables: _Optional[_Iterable[_Union[TableDecl, _Mapping]]] = ..., optimizer: _Optional[_Union[Optimizer, _Mapping]] = ..., pieces: _Optional[_Iterable[_Union[Piece, _Mapping]]] = ..., keys: _Optional[_Iterable[str]] = ..., sequence: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("version", "note", "incarnation", "duplicate")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    version: int
    note: str
    incarnation: int
    duplicate: bool
    def __init__(self, version: _Optional[int] = ..., note: _Optional[str] = ..., incarnation: _Optional[int] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("statistics_json",)
    STATISTICS_JSON_FIELD_NUMBER: _ClassVar[int]
    statistics_json: str
    def __init__(self, statistics_json: _Optional[str] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CheckpointReply(_message.Message):
    __slots__ = ("path", "version")
    PATH_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    path: str
    version: int
    def __init__(self, path: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...
