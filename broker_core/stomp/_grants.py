"""Who may SEND to a temporary destination it did not create.

Only a user that consumed a message naming that destination in
``reply-to``, and only a reply carrying the correlation id that message
calls for (its ``correlation-id``, else its ``message-id``: the JMS
convention the gateway's requestors match replies by). So a user that may
not take a route's requests cannot forge their replies, and one that takes
some requests cannot answer others'. Grants are kept per login (a back end
may reply from another connection), at most ``MAX_GRANTS`` per login, the
oldest forgotten first.
"""

from __future__ import annotations

import collections
from typing import Any

__all__ = ["ReplyGrants", "MAX_GRANTS"]

MAX_GRANTS = 10000


class ReplyGrants:
    def __init__(self, limit: int = MAX_GRANTS) -> None:
        self.limit = limit
        self._by_login: dict[str, collections.OrderedDict[tuple[Any, str], None]] = {}

    def grant(self, login: str, reply_to: Any, correlation_id: str) -> None:
        grants = self._by_login.get(login)
        if grants is None:
            grants = self._by_login[login] = collections.OrderedDict()
        key = (reply_to, correlation_id)
        if key in grants:
            grants.move_to_end(key)
            return
        grants[key] = None
        if len(grants) > self.limit:
            grants.popitem(last=False)

    def allows(self, login: str, destination: Any, correlation_id: str | None) -> bool:
        if correlation_id is None:
            return False
        grants = self._by_login.get(login)
        return grants is not None and (destination, correlation_id) in grants
