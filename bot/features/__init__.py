"""One router per feature, composed here (bedevere's layout)."""

from bot.features import checks, commands, installations, labels, nightly
from bot.github.routing import Router

router = Router(labels.router, commands.router, checks.router, installations.router, nightly.router)

__all__ = ["router"]
