"""What a handler may use: the store, the GitHub edge, the settings and the data directories."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from github import Github

from bot.github.client import GitHubApp
from bot.store.jobs import Store
from bot.web.metrics import Metrics
from bot.web.settings import Settings


@dataclass
class Context:
    settings: Settings
    store: Store
    github: GitHubApp
    metrics: Metrics
    # set when new work arrives; a multiprocessing.Event when the background worker is a child process
    wake: Any = field(default_factory=threading.Event)

    def gh(self, installation_id: int) -> Github:
        return self.github.client(installation_id)

    @property
    def clones_dir(self) -> Path:
        return self.settings.data_dir / "clones"

    @property
    def sources_dir(self) -> Path:
        return self.settings.data_dir / "sources"
