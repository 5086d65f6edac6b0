from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Phase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PHASE_UNSPECIFIED: _ClassVar[Phase]
    STATUS: _ClassVar[Phase]
    GATHER: _ClassVar[Phase]
    BROADCAST: _ClassVar[Phase]
PHASE_UNSPECIFIED: Phase
STATUS: Phase
GATHER: Phase
BROADCAST: Phase

class RegisterRequest(_message.Message):
    __slots__ = ("rank", "host", "pid", "version")
    RANK_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    rank: int
    host: str
    pid: int
    version: str
    def __init__(self, rank: _Optional[int] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., version: _Optional[str] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ("rank", "host", "pid")
    RANK_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    rank: int
    host: str
    pid: int
    def __init__(self, rank: _Optional[int] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("size", "members")
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    size: int
    members: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, size: _Optional[int] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class Exchange(_message.Message):
    __slots__ = ("phase", "sequence", "data")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    phase: Phase
    sequence: int
    data: bytes
    def __init__(self, phase: _Optional[_Union[Phase, str]] = ..., sequence: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class ExchangeReply(_message.Message):
    __slots__ = ("phase", "sequence", "data", "parts", "abort")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    phase: Phase
    sequence: int
    data: bytes
    parts: _containers.RepeatedScalarFieldContainer[bytes]
    abort: str
    def __init__(self, phase: _Optional[_Union[Phase, str]] = ..., sequence: _Optional[int] = ..., data: _Optional[bytes] = ..., parts: _Optional[_Iterable[bytes]] = ..., abort: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("rank", "cycles", "waiting")
    RANK_FIELD_NUMBER: _ClassVar[int]
    CYCLES_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    rank: int
    cycles: int
    waiting: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, rank: _Optional[int] = ..., cycles: _Optional[int] = ..., waiting: _Optional[_Iterable[str]] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("abort",)
    ABORT_FIELD_NUMBER: _ClassVar[int]
    abort: str
    def __init__(self, abort: _Optional[str] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RankStatus(_message.Message):
    __slots__ = ("rank", "host", "pid", "cycles", "seconds_since_heartbeat", "waiting", "others_wait_for")
    RANK_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    CYCLES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_SINCE_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    OTHERS_WAIT_FOR_FIELD_NUMBER: _ClassVar[int]
    rank: int
    host: str
    pid: int
    cycles: int
    seconds_since_heartbeat: float
    waiting: _containers.RepeatedScalarFieldContainer[str]
    others_wait_for: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, rank: _Optional[int] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., cycles: _Optional[int] = ..., seconds_since_heartbeat: _Optional[float] = ..., waiting: _Optional[_Iterable[str]] = ..., others_wait_for: _Optional[_Iterable[str]] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("size", "ranks", "abort")
    SIZE_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    size: int
    ranks: _containers.RepeatedCompositeFieldContainer[RankStatus]
    abort: str
    def __init__(self, size: _Optional[int] = ..., ranks: _Optional[_Iterable[_Union[RankStatus, _Mapping]]] = ..., abort: _Optional[str] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("rank", "reason")
    RANK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    rank: int
    reason: str
    def __init__(self, rank: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class AbortReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
