"""Helpers for testing unison itself: emulated hosts for multi-host jobs (`unison.testing.hosts`)."""
