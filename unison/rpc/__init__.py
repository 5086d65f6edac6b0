"""The network toolkit under the coordinator service and the parameter servers: one way to run a gRPC service.

Both services (`unison.service`, rank 0's coordinator; `unison.ps`, the parameter servers) sit on
these modules, one concept each:

- `security`: the job secret (where it comes from) and the constant-time check of the token every
  call carries in its metadata;
- `gate`: the server interceptor that refuses a call without the secret before it holds a worker
  thread, and bounds the calls with it served at once;
- `methods`: how a service declares its method table (names, message types, whether the caller
  streams requests and the service streams replies), and the status each of its refusals travels as;
- `handlers`: the server side of a table: every method reads raw frames, parsed in the handler, so a
  message that is not protobuf fails its call with ``INVALID_ARGUMENT`` and the server goes on;
- `stub`: the client side of a table: every call through one wrapper (deadline, retry policy, the
  caller's translation of a gRPC status into a unison error);
- `endpoints`: the channel and server options both ends agree on, and starting a server behind its gate;
- `heartbeat`: the loop the heartbeat and watch threads of both services run.

Nothing here imports grpc at the package's import: `security` is read by the launcher and the
parameter servers' role resolution, which must work without grpc installed.
"""
