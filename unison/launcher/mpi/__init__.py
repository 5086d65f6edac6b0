"""Starting ranks through mpiexec: which mpiexec, its command line, the variables it passes, the programs it
can start, and its own messages while the job runs."""
