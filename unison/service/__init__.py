"""The coordinator as a gRPC service: rank 0 hosts it, every rank negotiates through it.

With ``UNISON_CONTROLLER=grpc`` the engine's three control-plane steps (status allgather, request
gather, response broadcast) travel over one authenticated gRPC stream per rank instead of MPI (a rank
other than 0 receives the broadcast as the reply to its gather); the data plane stays on MPI and the
negotiation logic (`unison.coordinator`) is the same code. The service also receives heartbeats, so a
rank that dies or stops is detected within ``UNISON_HEARTBEAT_TIMEOUT_SECONDS`` and the job is aborted
with that rank named, and it serves a live status table (``python -m unison.status``).
"""
