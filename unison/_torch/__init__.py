"""Submodules of `unison.torch`, which is a single file: its ``__path__`` points here."""
