"""The former name of `unison.elastic.membership`, kept for the modules that still import it."""

from .membership import Epoch

__all__ = ["Epoch"]
