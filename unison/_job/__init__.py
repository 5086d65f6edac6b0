"""The job: one process's part of a unison job, below every API.

`runtime` starts and ends the job (`init`, `shutdown`, the `Job` that owns the engine, the table of
calls behind Horovod's integer handles and process-set membership); `launch` holds one plug-in per way a
process becomes a rank (MPI, a torch store, a single process); `startup` bounds `init()`'s first steps;
`submit` is the submit path every API and adapter shares, and `calls` what a submission returns; `collectives` and `objects` are the public collectives on NumPy arrays and on
Python objects; `gradients` is the gradient policy every DistributedOptimizer shares; `failure`,
`summary` and `exit_watch` turn a rank's failure into a named, bounded end of the job; `torch_launch`
reads a job that torchrun started; `gpu_available` probes for a GPU; `elastic_module` is the
``hvd.elastic`` attribute of the framework modules. Nothing here is public: the public modules re-export.
"""
