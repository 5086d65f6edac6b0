"""Tools for testing multi-rank code: the lockstep pytest plugin (`unison.testing.pytest_plugin`), its runner (`unison.testing.run`), emulated hosts (`unison.testing.hosts`)."""
