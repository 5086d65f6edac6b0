"""The job secret under the coordinator service's name: `unison.status` and the launcher import it here.

It lives in `unison.rpc.security`, shared with the parameter servers.
"""

from __future__ import annotations

from ..rpc.security import TOKEN_KEY, load_secret, new_secret

__all__ = ["TOKEN_KEY", "load_secret", "new_secret"]
