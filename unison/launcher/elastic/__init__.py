"""The elastic driver in unisonrun: one launch per membership epoch, and the endpoint rank 0 asks about hosts.

It decides with `unison.elastic.membership` and nothing else of `unison.elastic` (the ranks' side).
"""
