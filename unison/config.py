"""The one reader of configuration: a frozen `Settings` parsed once from keywords and the environment.

Every knob has a ``UNISON_*`` variable and, where Horovod has one, the ``HOROVOD_*`` alias (Paddle's
``PADDLE_*`` for the parameter-server ones); the ``UNISON_*`` name wins when both are set. `SETTINGS_TABLE` lists them all (docs/configuration.md is
checked against it by a test).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import ConfigError

__all__ = ["SETTINGS_TABLE", "Setting", "Settings", "load_settings", "settings_despite_errors", "split_service_addr"]

MiB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Setting:
    """One knob: its field name, variables, parser, default and meaning."""

    field: str
    env: str
    alias: str | None
    kind: str  # "int", "float", "bool", "str", "level"
    default: Any
    meaning: str


SETTINGS_TABLE: tuple[Setting, ...] = (
    Setting("fusion_threshold_bytes", "UNISON_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD", "int",
            128 * MiB, "Largest number of bytes packed into one fused reduction; 0 disables fusion."),
    Setting("fusion_max_tensor_bytes", "UNISON_FUSION_MAX_TENSOR_BYTES", None, "int", 64 * 1024,
            "Tensors larger than this are reduced in place instead of being copied into the fusion "
            "buffer (the copy costs about what fusion saves for large tensors)."),
    Setting("chunk_bytes", "UNISON_CHUNK_BYTES", None, "int", 4 * MiB,
            "Large reductions are issued as in-place chunks of this many bytes (faster than one huge "
            "call on shared memory); 0 sends each buffer in one call."),
    Setting("cycle_time_seconds", "UNISON_CYCLE_TIME", "HOROVOD_CYCLE_TIME", "ms", 0.0,
            "Minimum time between the starts of two negotiation cycles, in milliseconds. 0 (the "
            "default) starts a cycle as soon as work is enqueued."),
    Setting("idle_cycle_seconds", "UNISON_IDLE_CYCLE_SECONDS", None, "float", 0.1,
            "How often an idle rank joins a cycle, so that shutdown and stall checks progress."),
    Setting("cache_capacity", "UNISON_CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY", "int", 1024,
            "Responses kept in the response cache; 0 disables the cache (every cycle negotiates)."),
    Setting("stall_check_disable", "UNISON_STALL_CHECK_DISABLE", "HOROVOD_STALL_CHECK_DISABLE",
            "bool", False, "Turn the stall inspector off."),
    Setting("stall_check_seconds", "UNISON_STALL_CHECK_TIME_SECONDS",
            "HOROVOD_STALL_CHECK_TIME_SECONDS", "float", 60.0,
            "Warn (on rank 0) when some ranks have waited this long for others to submit a tensor."),
    Setting("stall_shutdown_seconds", "UNISON_STALL_SHUTDOWN_TIME_SECONDS",
            "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "float", 600.0,
            "Stop the job with an error on every rank after a stall this long; 0 never stops."),
    Setting("deadlock_seconds", "UNISON_DEADLOCK_SECONDS", None, "float", 2.0,
            "Stop the job at once when every rank a pending collective waits for is itself blocked "
            "waiting in unison, after this long in that state; 0 turns the check off."),
    Setting("stall_stacks", "UNISON_STALL_STACKS", None, "bool", False,
            "Stall and deadlock reports list the main-thread stack of every rank they name (each rank's "
            "place, its user frames, is named either way)."),
    Setting("flight_records", "UNISON_FLIGHT_RECORDS", None, "int", 1000,
            "Collectives each rank keeps in its flight record (the last ones it submitted), written when "
            "the job stalls, deadlocks or a rank fails; 0 keeps none."),
    Setting("flight_dir", "UNISON_FLIGHT_DIR", None, "str", "",
            "Directory the ranks write their flight records to. Unset: under unisonrun its --output-filename "
            "directory or a new one it names; otherwise unison-flight-<user>/<parent pid> in the system's "
            "temporary directory."),
    Setting("timeline", "UNISON_TIMELINE", "HOROVOD_TIMELINE", "str", "",
            "Path of a Chrome-trace timeline written by rank 0; DYNAMIC enables start_timeline()."),
    Setting("timeline_mark_cycles", "UNISON_TIMELINE_MARK_CYCLES", "HOROVOD_TIMELINE_MARK_CYCLES",
            "bool", False, "Mark the start of every cycle in the timeline."),
    Setting("log_level", "UNISON_LOG_LEVEL", "HOROVOD_LOG_LEVEL", "level", "warning",
            "Level of unison's log: trace, debug, info, warning (or warn), error or fatal (or critical), "
            "in any case."),
    Setting("log_hide_time", "UNISON_LOG_HIDE_TIME", "HOROVOD_LOG_HIDE_TIME", "bool", False,
            "Drop timestamps from unison's log lines."),
    Setting("controller", "UNISON_CONTROLLER", "HOROVOD_CONTROLLER", "str", "mpi",
            "Control plane carrying the negotiation: mpi, or grpc (a service hosted by rank 0; data "
            "still moves over MPI)."),
    Setting("service_addr", "UNISON_SERVICE_ADDR", None, "str", "",
            "host:port the grpc coordinator service binds on rank 0. Unset: 127.0.0.1 and a free port "
            "on a single host; required when ranks span several hosts."),
    Setting("secret", "UNISON_SECRET", None, "str", "",
            "Per-job secret authenticating every call to the grpc service (at least 32 characters). "
            "Unset: rank 0 makes a random one and hands it to the other ranks over MPI."),
    Setting("secret_file", "UNISON_SECRET_FILE", None, "str", "",
            "File holding the secret instead (must not be readable by group or others: mode 0600)."),
    Setting("tls_cert_file", "UNISON_TLS_CERT_FILE", None, "str", "",
            "PEM certificate (or chain) that unison's gRPC services present: the coordinator service "
            "(UNISON_CONTROLLER=grpc) and parameter servers. Set, every gRPC channel is encrypted and "
            "clients check the service against UNISON_TLS_CA_FILE. Unset: channels are plain text "
            "(the job secret still authenticates every call)."),
    Setting("tls_key_file", "UNISON_TLS_KEY_FILE", None, "str", "",
            "Private key of UNISON_TLS_CERT_FILE, needed where a service runs (must not be readable by "
            "group or others: mode 0600)."),
    Setting("tls_ca_file", "UNISON_TLS_CA_FILE", None, "str", "",
            "PEM certificates a client trusts for the services' certificate. Unset: "
            "UNISON_TLS_CERT_FILE itself (one self-signed certificate for the job)."),
    Setting("tls_server_name", "UNISON_TLS_SERVER_NAME", None, "str", "",
            "Name clients expect in the services' certificate instead of the host they connect to."),
    Setting("service_host_aggregation", "UNISON_SERVICE_HOST_AGGREGATION", None, "bool", True,
            "grpc controller: the lowest rank of each host gathers its host's status rows and requests "
            "over shared memory and negotiates for all of them (one stream per host instead of one per "
            "rank). Set to 0 for one stream per rank."),
    Setting("heartbeat_timeout_seconds", "UNISON_HEARTBEAT_TIMEOUT_SECONDS", None, "float", 10.0,
            "grpc controller: a rank silent this long is declared dead and the job is aborted; a rank "
            "whose heartbeats rank 0 leaves unanswered this long fails its collectives (rank 0 stopped)."),
    Setting("peer_timeout_seconds", "UNISON_PEER_TIMEOUT_SECONDS", None, "float", 10.0,
            "mpi controller: a control exchange still waiting after this long sends a liveness probe "
            "to every rank; ranks that do not answer it within 3 s (or this long, if shorter: frozen, "
            "dead, unreachable) are named and the job is aborted. A data-plane call still waiting after "
            "this long probes too (and again each time this long passes), and also aborts the job naming the peers that answer, four times over "
            "3 s, from a control exchange of their next cycle without having completed the call (they never "
            "joined it). 0 waits forever."),
    Setting("start_timeout_seconds", "UNISON_START_TIMEOUT_SECONDS", None, "float", 60.0,
            "How long init() waits for every rank to arrive and to finish its local set-up; the ranks "
            "that did not are named and init() raises on the others. 0 waits forever."),
    Setting("launcher_dir", "UNISON_LAUNCHER_DIR", None, "str", "",
            "Set by unisonrun for the ranks it starts: a private directory where each rank records "
            "that it started, failed or finished, so the launcher can name a rank that died."),
    Setting("launcher_relay", "UNISON_LAUNCHER_RELAY", None, "str", "",
            "Set by unisonrun for ranks on other hosts than its own: KEY@HOST:PORT of its marker relay, "
            "which carries those ranks' started/failed/finished records to the launcher."),
    Setting("launcher_keep_going", "UNISON_LAUNCHER_KEEP_GOING", None, "bool", False,
            "Set by unisonrun --pservers for its trainers' keepers: a rank killed by a signal is reported to "
            "mpiexec as exit status 128+N, so mpiexec leaves the other ranks running."),
    Setting("elastic_epoch", "UNISON_ELASTIC_EPOCH", None, "int", 0,
            "Set by unisonrun's elastic driver for every launch: the membership epoch."),
    Setting("elastic_driver", "UNISON_ELASTIC_DRIVER", None, "str", "",
            "Set by unisonrun's elastic driver: KEY@HOST:PORT of its endpoint, which rank 0 asks about "
            "host changes in signed lines under KEY (empty: not an elastic launch)."),
    Setting("elastic_store", "UNISON_ELASTIC_STORE", None, "str", "",
            "Set by unisonrun's elastic driver: the job's shared-memory directory for commits."),
    Setting("elastic_hosts", "UNISON_ELASTIC_HOSTS", None, "str", "",
            "Set by unisonrun's elastic driver: this epoch's host:slots list, in rank order."),
    Setting("ps_role", "UNISON_PS_ROLE", "PADDLE_TRAINING_ROLE", "str", "",
            "Parameter-server jobs: server or trainer (set by unisonrun --pservers; see docs/ps.md)."),
    Setting("ps_trainer_id", "UNISON_PS_TRAINER_ID", "PADDLE_TRAINER_ID", "int", -1,
            "Parameter-server jobs: this trainer's id (-1: the MPI rank)."),
    Setting("ps_server_index", "UNISON_PS_SERVER_INDEX", None, "int", -1,
            "Parameter-server jobs: this server's place in UNISON_PS_ENDPOINTS (-1: where Paddle's "
            "POD_IP:PADDLE_PORT is in it)."),
    Setting("ps_endpoints", "UNISON_PS_ENDPOINTS", "PADDLE_PSERVERS_IP_PORT_LIST", "str", "",
            "Parameter-server jobs: every server's host:port, comma-separated, in server order."),
    Setting("ps_num_trainers", "UNISON_PS_NUM_TRAINERS", "PADDLE_TRAINERS_NUM", "int", 0,
            "Parameter-server jobs: the number of trainers (required)."),
    Setting("ps_num_servers", "UNISON_PS_NUM_SERVERS", None, "int", 0,
            "Parameter-server jobs: the number of servers (0: those in UNISON_PS_ENDPOINTS)."),
    Setting("ps_mode", "UNISON_PS_MODE", None, "str", "async",
            "Parameter-server jobs: async (apply each push) or sync (apply the average of every "
            "trainer's step)."),
    Setting("ps_checkpoint_dir", "UNISON_PS_CHECKPOINT_DIR", None, "str", "",
            "Parameter-server jobs: servers keep and resume their shards here (empty: nowhere)."),
    Setting("ps_checkpoint_seconds", "UNISON_PS_CHECKPOINT_SECONDS", None, "float", 0.0,
            "Parameter-server jobs: servers write a checkpoint this often (0: on request and at the end)."),
    Setting("ps_trainer_timeout_seconds", "UNISON_PS_TRAINER_TIMEOUT_SECONDS", None, "float", 10.0,
            "Parameter-server jobs: a trainer silent this long is gone."),
    Setting("ps_reconnect_seconds", "UNISON_PS_RECONNECT_SECONDS", None, "float", 60.0,
            "Parameter-server jobs: how long a trainer waits for a server that stopped answering "
            "(retrying, so a restarted server is picked up) before it raises ServerUnavailableError."),
    Setting("ps_address_file", "UNISON_PS_ADDRESS_FILE", None, "str", "",
            "Parameter-server jobs: a server listens on any port and writes its host:port here."),
    Setting("cpu_operations", "UNISON_CPU_OPERATIONS", "HOROVOD_CPU_OPERATIONS", "str", "mpi",
            "Data plane for CPU buffers: mpi."),
    Setting("gpu_operations", "UNISON_GPU_OPERATIONS", "HOROVOD_GPU_OPERATIONS", "str", "nccl",
            "Data plane for CUDA buffers: nccl (through CuPy), or mpi (CUDA-aware MPI on the device "
            "buffers where every rank's MPI library says it is CUDA-aware, else staged through pinned "
            "host memory and reduced like CPU buffers). See docs/gpu.md."),
    Setting("cuda_aware_mpi", "UNISON_CUDA_AWARE_MPI", None, "bool", True,
            "With UNISON_GPU_OPERATIONS=mpi: hand CUDA buffers to MPI when every rank's MPI library "
            "answers MPIX_Query_cuda_support with yes (never assumed). 0 stages through host memory even "
            "then, for a library that answers wrongly."),
    Setting("nccl_init_timeout_seconds", "UNISON_NCCL_INIT_TIMEOUT_SECONDS", None, "float", 120.0,
            "How long the ranks of a process set wait for each other while their NCCL communicator is "
            "made; then every member raises an error naming the ranks that never arrived."),
    Setting("dynamic_process_sets", "UNISON_DYNAMIC_PROCESS_SETS", "HOROVOD_DYNAMIC_PROCESS_SETS",
            "bool", False, "Allow add_process_set()/remove_process_set() after init()."),
    Setting("disable_group_fusion", "UNISON_DISABLE_GROUP_FUSION", "HOROVOD_DISABLE_GROUP_FUSION",
            "bool", False, "Fuse the tensors of a grouped op only with each other."),
    Setting("hierarchical_allreduce", "UNISON_HIERARCHICAL_ALLREDUCE", "HOROVOD_HIERARCHICAL_ALLREDUCE",
            "bool", False, "Allreduce in three steps when ranks span several hosts: reduce within each "
            "host, allreduce across hosts among one rank per host, broadcast within each host."),
    Setting("cpu_overlap", "UNISON_CPU_OVERLAP", None, "bool", False,
            "PyTorch DistributedOptimizer: start reducing a CPU gradient as soon as backward() produces "
            "it, as Horovod does. Off (the default): they are reduced together when step() or "
            "synchronize() is called, which is faster when the ranks' computation keeps every core busy, "
            "as it does in CPU training."),
    Setting("autotune", "UNISON_AUTOTUNE", "HOROVOD_AUTOTUNE", "bool", False,
            "Tune the fusion threshold, cycle time, chunk size and cache use during the first steps of "
            "training, scored by bytes reduced per second; rank 0 decides and every rank applies the "
            "same parameters at the same cycle (see Autotune below)."),
    Setting("autotune_log", "UNISON_AUTOTUNE_LOG", "HOROVOD_AUTOTUNE_LOG", "str", "",
            "CSV file where rank 0 writes one row per autotune sample and a last row with the chosen "
            "parameters."),
    Setting("autotune_warmup_samples", "UNISON_AUTOTUNE_WARMUP_SAMPLES", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES",
            "int", 3, "Autotune samples discarded at the start, before any parameter is changed."),
    Setting("autotune_steps_per_sample", "UNISON_AUTOTUNE_STEPS_PER_SAMPLE",
            "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "int", 10,
            "Cycles that reduced something in one autotune sample (at least 1)."),
    Setting("autotune_max_samples", "UNISON_AUTOTUNE_MAX_SAMPLES", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
            "int", 20, "Autotune samples measured after the warm-up before the best parameters are kept "
            "(at least 1)."),
    Setting("mpi_threads_disable", "UNISON_MPI_THREADS_DISABLE", "HOROVOD_MPI_THREADS_DISABLE",
            "bool", False, "Ask MPI for MPI_THREAD_SERIALIZED instead of MPI_THREAD_MULTIPLE."),
)

_LEVELS = ("trace", "debug", "info", "warning", "error", "fatal")
# Other spellings of those levels: Python's (``logging.WARN``, ``CRITICAL``) and the short ``warn``
# that Horovod's log parser also ends up at (it takes any unknown text as warning).
_LEVEL_ALIASES = {"warn": "warning", "critical": "fatal"}
_TRUE = ("true", "yes", "on")
_FALSE = ("false", "no", "off")
_CHOICES = {"controller": ("mpi", "grpc"), "ps_mode": ("async", "sync"), "cpu_operations": ("mpi",), "gpu_operations": ("nccl", "mpi")}


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every knob of a unison job, parsed once at `init()`; see `SETTINGS_TABLE` for meanings."""

    fusion_threshold_bytes: int = 128 * MiB
    fusion_max_tensor_bytes: int = 64 * 1024
    chunk_bytes: int = 4 * MiB
    cycle_time_seconds: float = 0.0
    idle_cycle_seconds: float = 0.1
    cache_capacity: int = 1024
    stall_check_disable: bool = False
    stall_check_seconds: float = 60.0
    stall_shutdown_seconds: float = 600.0
    deadlock_seconds: float = 2.0
    stall_stacks: bool = False
    flight_records: int = 1000
    flight_dir: str = ""
    timeline: str = ""
    timeline_mark_cycles: bool = False
    log_level: str = "warning"
    log_hide_time: bool = False
    controller: str = "mpi"
    service_addr: str = ""
    secret: str = dataclasses.field(default="", repr=False)
    secret_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_ca_file: str = ""
    tls_server_name: str = ""
    service_host_aggregation: bool = True
    heartbeat_timeout_seconds: float = 10.0
    peer_timeout_seconds: float = 10.0
    start_timeout_seconds: float = 60.0
    launcher_dir: str = ""
    launcher_relay: str = ""
    launcher_keep_going: bool = False
    elastic_epoch: int = 0
    elastic_driver: str = ""
    elastic_store: str = ""
    elastic_hosts: str = ""
    ps_role: str = ""
    ps_trainer_id: int = -1
    ps_server_index: int = -1
    ps_endpoints: str = ""
    ps_num_trainers: int = 0
    ps_num_servers: int = 0
    ps_mode: str = "async"
    ps_checkpoint_dir: str = ""
    ps_checkpoint_seconds: float = 0.0
    ps_trainer_timeout_seconds: float = 10.0
    ps_reconnect_seconds: float = 60.0
    ps_address_file: str = ""
    cpu_operations: str = "mpi"
    gpu_operations: str = "nccl"
    nccl_init_timeout_seconds: float = 120.0
    cuda_aware_mpi: bool = True
    dynamic_process_sets: bool = False
    disable_group_fusion: bool = False
    mpi_threads_disable: bool = False
    hierarchical_allreduce: bool = False
    cpu_overlap: bool = False
    autotune: bool = False
    autotune_log: str = ""
    autotune_warmup_samples: int = 3
    autotune_steps_per_sample: int = 10
    autotune_max_samples: int = 20


# Settings every rank must share: each rank plans fusion, chunks MPI calls and keeps its response
# cache on its own, and all ranks must build the same control plane. A difference would hang the job
# or mix up buffers, so init() compares them first (`disagreement`).
JOB_WIDE_SETTINGS = ("fusion_threshold_bytes", "fusion_max_tensor_bytes", "chunk_bytes", "cache_capacity",
                     "controller", "service_host_aggregation", "hierarchical_allreduce",
                     "disable_group_fusion", "dynamic_process_sets", "cpu_operations", "gpu_operations",
                     "autotune")


def job_wide_values(settings: Settings) -> dict[str, Any]:
    """This rank's values of `JOB_WIDE_SETTINGS`, as plain JSON-able data."""
    return {name: getattr(settings, name) for name in JOB_WIDE_SETTINGS}


def disagreement(values_by_rank: Sequence[Mapping[str, Any]]) -> str:
    """Explain the first job-wide setting whose value differs between ranks ('' when all agree).

    Example:
        >>> disagreement([{"chunk_bytes": 4}, {"chunk_bytes": 4}, {"chunk_bytes": 8}])
        'UNISON_CHUNK_BYTES differs between ranks: 4 on ranks [0, 1]; 8 on rank [2]. Every rank must use the same value: set it in the environment of every rank (unisonrun -x NAME=VALUE passes it to other hosts).'
    """
    env = {s.field: s.env for s in SETTINGS_TABLE}
    for name in values_by_rank[0] if values_by_rank else ():
        groups: dict[str, list[int]] = {}
        for rank, values in enumerate(values_by_rank):
            groups.setdefault(repr(values.get(name)), []).append(rank)
        if len(groups) > 1:
            listing = "; ".join(f"{value} on {'rank' if len(ranks) == 1 else 'ranks'} {ranks}"
                                for value, ranks in groups.items())
            return (f"{env.get(name, name)} differs between ranks: {listing}. Every rank must use the same "
                    "value: set it in the environment of every rank (unisonrun -x NAME=VALUE passes it to "
                    "other hosts).")
    return ""


def _parse(setting: Setting, variable: str, raw: str) -> Any:
    text = raw.strip()
    try:
        if setting.kind == "int":
            value: Any = int(text)
            if value < 0:
                raise ValueError
            return value
        if setting.kind in ("float", "ms"):
            number = float(text)
            if number < 0 or number != number:
                raise ValueError
            return number / 1000.0 if setting.kind == "ms" else number
        if setting.kind == "bool":
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE or not text:
                return False
            return int(text) > 0
    except ValueError:
        pass
    else:
        if setting.kind == "level":
            if text.lower() in _LEVELS:
                return text.lower()
            if text.lower() in _LEVEL_ALIASES:
                return _LEVEL_ALIASES[text.lower()]
        elif setting.kind == "str":
            if setting.field in _CHOICES:
                if text.lower() in _CHOICES[setting.field]:
                    return text.lower()
            else:
                return text
    expected = {
        "int": "a non-negative integer",
        "float": "a non-negative number",
        "ms": "a non-negative number of milliseconds",
        "bool": ("0 or 1 (any integer above 0 is on), or one of " + ", ".join(_TRUE + _FALSE)
                 + " in any case"),
        "level": ("one of " + ", ".join(_LEVELS) + " in any case (also " +
                  ", ".join(f"{k} for {v}" for k, v in _LEVEL_ALIASES.items()) + ")"),
        "str": "one of " + ", ".join(_CHOICES.get(setting.field, ("text",))),
    }[setting.kind]
    raise ConfigError(f"{variable} must be {expected}. Got {variable}={raw!r}.")


def load_settings(
    environ: Mapping[str, str] | None = None, **overrides: Any
) -> Settings:
    """Build `Settings` from keyword overrides, then ``UNISON_*`` variables, then ``HOROVOD_*`` ones.

    Example:
        >>> load_settings({"HOROVOD_FUSION_THRESHOLD": "0"}).fusion_threshold_bytes
        0
    """
    known = {s.field: s for s in SETTINGS_TABLE}
    values, source = _values(os.environ if environ is None else environ, overrides, strict=True)
    settings = Settings(**values)
    if settings.service_addr:
        split_service_addr(settings.service_addr)
    if settings.stall_shutdown_seconds and settings.stall_shutdown_seconds < settings.stall_check_seconds:
        raise ConfigError(
            "UNISON_STALL_SHUTDOWN_TIME_SECONDS must be 0 or at least UNISON_STALL_CHECK_TIME_SECONDS. "
            f"Got {settings.stall_shutdown_seconds} < {settings.stall_check_seconds}."
        )
    if not (settings.deadlock_seconds >= 0 and math.isfinite(settings.deadlock_seconds)):
        raise ConfigError(
            "UNISON_DEADLOCK_SECONDS must be 0 (no deadlock check) or a positive number of seconds. "
            f"Got {settings.deadlock_seconds}."
        )
    for name in ("autotune_steps_per_sample", "autotune_max_samples"):
        if getattr(settings, name) < 1:
            variable = source.get(name, known[name].env)
            raise ConfigError(f"{variable} must be at least 1. Got {variable}={getattr(settings, name)}.")
    if settings.nccl_init_timeout_seconds <= 0:
        variable = source.get("nccl_init_timeout_seconds", "UNISON_NCCL_INIT_TIMEOUT_SECONDS")
        raise ConfigError(f"{variable} must be a positive number of seconds. "
                          f"Got {variable}={settings.nccl_init_timeout_seconds}.")
    return settings


def settings_despite_errors(environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Build `Settings` as `load_settings` does, with the default in place of each value that does not parse.

    For a rank whose `load_settings` raised: it still needs the settings it can read (where its
    launcher's directory is, how long to wait for the others) to report that error, and to report it
    as its own.

    Example:
        >>> env = {"UNISON_PEER_TIMEOUT_SECONDS": "abc", "UNISON_LAUNCHER_DIR": "/tmp/job"}
        >>> settings = settings_despite_errors(env)
        >>> settings.launcher_dir, settings.peer_timeout_seconds == Settings().peer_timeout_seconds
        ('/tmp/job', True)
    """
    values, _ = _values(os.environ if environ is None else environ, overrides, strict=False)
    return Settings(**values)


def _values(env: Mapping[str, str], overrides: Mapping[str, Any],
            strict: bool) -> tuple[dict[str, Any], dict[str, str]]:
    """The values set by keyword or variable (field -> value), and where each came from (field -> name).

    Not `strict`: a keyword or variable that does not parse is left out (its default stands).
    """
    known = {s.field: s for s in SETTINGS_TABLE}
    values: dict[str, Any] = {}
    source: dict[str, str] = {}  # field -> the keyword or variable it came from, for errors

    def take(setting: Setting, name: str, raw: Any) -> None:
        try:
            values[setting.field] = _parse(setting, name, raw) if isinstance(raw, str) else raw
        except ConfigError:
            if strict:
                raise
            return
        source[setting.field] = name

    for name, value in overrides.items():
        if name not in known:
            if not strict:
                continue
            raise ConfigError(
                f"Unknown setting {name!r}. Known settings: {', '.join(sorted(known))}."
            )
        take(known[name], name, value)
    for setting in SETTINGS_TABLE:
        if setting.field in values or setting.field in overrides:
            continue
        for variable in (setting.env, setting.alias):
            if variable and variable in env:
                take(setting, variable, env[variable])
                break
    return values, source


def split_service_addr(address: str) -> tuple[str, int]:
    """``host:port`` as (host, port); raises ConfigError naming UNISON_SERVICE_ADDR otherwise.

    Example:
        >>> split_service_addr("10.0.0.5:29500")
        ('10.0.0.5', 29500)
    """
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(
            "UNISON_SERVICE_ADDR must be host:port with a port from 0 to 65535 (0: any free port), "
            f"for example 10.0.0.5:29500. Got UNISON_SERVICE_ADDR={address!r}."
        )
    return host, int(port)


def process_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the launcher variables that describe this process's place in the job (rank discovery)."""
    env = os.environ if environ is None else environ
    keys = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALRANKID",
            "SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS",
            # torch's env:// variables (torchrun, and the tools that start torch jobs the same way)
            "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_ERROR_FILE")
    return {k: env[k] for k in keys if k in env}


def settings_markdown() -> str:
    """Render `SETTINGS_TABLE` as the Markdown table of docs/configuration.md."""
    def default_text(setting: Setting) -> str:
        value = setting.default
        if setting.kind == "ms":
            return f"{value * 1000:g} (ms)"
        if setting.kind == "bool":
            return "1" if value else "0"
        if setting.kind == "str" and value == "":
            return "unset"
        return str(value)

    lines = ["| Variable | Horovod or Paddle alias | Default | Meaning |", "|---|---|---|---|"]
    for s in SETTINGS_TABLE:
        alias = f"`{s.alias}`" if s.alias else "-"
        lines.append(f"| `{s.env}` | {alias} | {default_text(s)} | {s.meaning} |")
    return "\n".join(lines) + "\n"
