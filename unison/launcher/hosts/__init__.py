"""Hosts: lists as users write them (``-H``, hostfiles), and reaching them the way mpiexec does."""
