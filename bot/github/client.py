"""The one client to GitHub's REST API: PyGithub against a configurable base URL, and one error mapping.

`GitHubApp` turns the App's JWT into per-installation clients; `token_client` is the Action's client on the
workflow's token. `call` runs one PyGithub operation and turns GitHub's refusal into `PlatformError` (`refusal`);
`call_renewing` does the same for an installation's client, and on a 401 (a revoked or otherwise stale installation
token) drops the token, mints a new one and retries the operation once. Only bot/github/github_platform.py calls
PyGithub's methods, and always through these.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from github import Auth, Github, GithubException
from github.GithubRetry import GithubRetry
from github.InstallationAuthorization import InstallationAuthorization

from bot.github.platform import PlatformError

log = logging.getLogger(__name__)
T = TypeVar("T")


def refusal(what: str, e: GithubException) -> PlatformError:
    """GitHub's error answer as PlatformError: what was asked, the HTTP status and GitHub's message."""
    message = e.data.get("message") if isinstance(e.data, dict) else e.data
    return PlatformError(f"{what}: HTTP {e.status}: {message}")


def call(what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)`, with GitHub's refusal raised as PlatformError naming `what`."""
    try:
        return fn(*args, **kwargs)
    except GithubException as e:
        raise refusal(what, e) from None


class InstallationAuth(Auth.AppInstallationAuth):
    """An installation's token, minted on first use and again before it expires (as PyGithub does), and dropped on
    demand (`drop`): the next request then mints a new one."""

    def __init__(self, app_auth: Auth.AppAuth, installation_id: int) -> None:
        super().__init__(app_auth, installation_id)
        self._minted: InstallationAuthorization | None = None
        self._mint_lock = threading.Lock()

    @property
    def token(self) -> str:
        with self._mint_lock:
            threshold = datetime.now(UTC) + Auth.TOKEN_REFRESH_THRESHOLD_TIMEDELTA
            if self._minted is None or self._minted.expires_at < threshold:
                self._minted = self._get_installation_authorization()
            return self._minted.token

    def drop(self) -> None:
        with self._mint_lock:
            self._minted = None


def drop_installation_token(gh: Github) -> bool:
    """Forget the installation token `gh` sends (False when `gh` is not an installation's client)."""
    auth = gh.requester.auth
    if not isinstance(auth, InstallationAuth):
        return False
    auth.drop()
    return True


def call_renewing(gh: Github, what: str, fn: Callable[[], T]) -> T:
    """`call(what, fn)` on `gh`; on HTTP 401 the installation token is dropped and `fn` retried once on a new one."""
    try:
        return fn()
    except GithubException as e:
        if e.status != 401 or not drop_installation_token(gh):
            raise refusal(what, e) from None
        log.warning("%s; the installation token was dropped, retrying once on a new one", refusal(what, e))
    return call(what, fn)


def token_client(token: str, base_url: str, *, seconds_between_requests: float | None = None,
                 seconds_between_writes: float | None = None) -> Github:
    """A client on one token (the Action's GITHUB_TOKEN); lazy: nothing is requested until an attribute is read."""
    return Github(auth=Auth.Token(token), base_url=base_url, lazy=True,
                  seconds_between_requests=seconds_between_requests, seconds_between_writes=seconds_between_writes)


class GitHubApp:
    """The App's identity: JWT from app id + private key; cached installation clients."""

    def __init__(
        self,
        app_id: int,
        private_key: str,
        base_url: str,
        *,
        git_url_template: str,
        seconds_between_requests: float = 0.25,
        seconds_between_writes: float = 1.0,
        retries: int = 3,
        timeout_seconds: int = 15,
    ) -> None:
        self._app_auth = Auth.AppAuth(app_id, private_key)
        self.base_url = base_url.rstrip("/")
        self.git_url_template = git_url_template
        self._kw: dict[str, Any] = {
            "base_url": self.base_url,
            "timeout": timeout_seconds,
            "retry": GithubRetry(total=retries, backoff_factor=0.2) if retries else None,
            "seconds_between_requests": seconds_between_requests,
            "seconds_between_writes": seconds_between_writes,
            "lazy": True,
        }
        self._clients: dict[int, tuple[Github, InstallationAuth]] = {}
        self._lock = threading.Lock()

    def client(self, installation_id: int) -> Github:
        return self._entry(installation_id)[0]

    def token(self, installation_id: int) -> str:
        """A live installation token (for git over HTTPS). Never log it."""
        return call(f"installation token for {installation_id}", lambda: self._entry(installation_id)[1].token)

    def clone_url(self, installation_id: int, repo: str) -> str:
        token = self.token(installation_id) if "{token}" in self.git_url_template else ""
        return self.git_url_template.format(token=token, repo=repo)

    def _entry(self, installation_id: int) -> tuple[Github, InstallationAuth]:
        with self._lock:
            entry = self._clients.get(installation_id)
            if entry is None:
                auth = InstallationAuth(self._app_auth, installation_id)
                entry = (Github(auth=auth, **self._kw), auth)
                self._clients[installation_id] = entry
            return entry
