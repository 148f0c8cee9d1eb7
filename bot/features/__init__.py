"""One router per feature, composed here (bedevere's layout)."""

from bot.features import checks, comments, installations, labels, schedule
from bot.github.routing import Router

router = Router(labels.router, comments.router, checks.router, installations.router, schedule.router)

__all__ = ["router"]
