"""The machinery behind unison's elastic modules (``unison.torch.elastic`` and the others); nothing public.

A membership epoch is one MPI launch. The elastic driver in `unisonrun` (``unison/launcher/elastic/driver.py``)
polls the discovery script, decides each epoch's hosts with `membership` (pure), starts ``mpiexec`` for
it and relaunches on a failure or a host change. In the ranks, ``state.commit()`` writes the state into
shared memory on each host (`store`, encoded by `_codec`), and the ``run`` wrapper (`_state`) restores
the newest commit of any host at the start of every epoch. docs/elastic.md says why.

`membership` and `store` are the two modules the launcher uses too (the driver decides with one, and
``unisonrun --status`` reads commits with the other); the rest is the ranks' own. What the driver
tells the ranks (variables, the host-change exit status) is in `unison._contract`.
"""

__all__: list[str] = []
