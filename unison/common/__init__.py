"""``horovod.common``'s module paths under unison: `exceptions`, `process_sets`, `util`, `elastic`.

Scripts that import from Horovod's common modules (``from horovod.common.exceptions import
HorovodInternalError``) run with ``horovod`` replaced by ``unison``; each submodule re-exports the
same objects as the framework modules.
"""

__all__: list[str] = []
