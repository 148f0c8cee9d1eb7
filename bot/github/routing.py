"""Event routing, gidgethub style: small per-feature routers composed into one."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from bot.github.webhooks import Event

log = logging.getLogger(__name__)

# A handler takes the event and the App's context (bot/context.py), which this layer passes through unread.
Handler = Callable[[Event, Any], None]


class Router:
    def __init__(self, *others: Router) -> None:
        self._routes: dict[tuple[str, str | None], list[Handler]] = defaultdict(list)
        for other in others:
            for key, handlers in other._routes.items():
                self._routes[key].extend(handlers)

    def register(self, event: str, action: str | None = None) -> Callable[[Handler], Handler]:
        """Decorator: call the handler for `event` (and only `action`, when given)."""

        def deco(fn: Handler) -> Handler:
            self._routes[(event, action)].append(fn)
            return fn

        return deco

    def handlers_for(self, ev: Event) -> list[Handler]:
        return self._routes.get((ev.name, None), []) + (
            self._routes.get((ev.name, ev.action), []) if ev.action else []
        )

    def dispatch(self, ev: Event, ctx: Any) -> int:
        """Run every matching handler; exceptions propagate (the delivery is then retried). Returns the count."""
        handlers = self.handlers_for(ev)
        for h in handlers:
            log.debug("delivery %s: %s.%s -> %s", ev.delivery_id, ev.name, ev.action, h.__qualname__)
            h(ev, ctx)
        return len(handlers)
