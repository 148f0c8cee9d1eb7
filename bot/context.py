"""What a handler may use: the store, the code host (one `Platform` per installation and repository), the settings,
the metrics and the data directories."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.github.client import GitHubApp
from bot.github.github_platform import GitHubPlatform
from bot.github.platform import Platform
from bot.store.store import Store
from bot.web.metrics import Metrics
from bot.web.settings import Settings


@dataclass
class Context:
    settings: Settings
    store: Store
    github: GitHubApp
    metrics: Metrics
    # set when new work arrives; a multiprocessing.Event when the background loop is a child process
    wake: Any = field(default_factory=threading.Event)

    def platform(self, installation_id: int, repo: str) -> Platform:
        """The repository on GitHub, as the installation sees it (no request is made here)."""
        return GitHubPlatform(self.github.client(installation_id), repo)

    @property
    def clones_dir(self) -> Path:
        return self.settings.data_dir / "clones"

    @property
    def sources_dir(self) -> Path:
        return self.settings.data_dir / "sources"
