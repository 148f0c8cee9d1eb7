"""What may be published: every text that leaves for GitHub (a PR body, a check run, a comment) passes `clip`: cut to
GitHub's 65536-character limit, and scrubbed of anything that looks like a credential and of absolute paths (a
runner's temporary directories are no business of the repository's).
"""

from __future__ import annotations

import re

from bot.logs import redact

BODY_LIMIT = 65_536  # GitHub's limit on a PR body, an issue comment and a check run's summary or text
# An absolute path of two or more parts that is not part of a URL, a relative path or /dev/null.
# An absolute path of two or more parts that is not part of a URL, a relative path or /dev/null.
_ABSOLUTE_PATH = re.compile(r"(?<![\w/.~:<>=-])/(?!dev/null\b)(?:[\w.@+-]+/)+([\w.@+-]*)")
CUT_NOTE = "\n\n*…cut to fit GitHub's limit.*"


def scrub(text: str, *, keep_paths: bool = False) -> str:
    """`text` without credentials (GitHub and API tokens, keys, PEM blocks, Authorization headers) and without
    absolute paths (each becomes `…/<its last part>`): verdict reasons, build logs and traces come from a machine
    that ran untrusted code, and what it printed may hold either. `keep_paths`: a patch, which must still apply, keeps
    its text but for credentials."""
    text = redact(text)
    return text if keep_paths else _ABSOLUTE_PATH.sub(lambda m: "…/" + m.group(1), text)


def clip(text: str, limit: int = BODY_LIMIT, *, keep_paths: bool = False) -> str:
    """What may be published: `scrub`bed, then cut to `limit` characters with a note saying so."""
    text = scrub(text, keep_paths=keep_paths)
    return text if len(text) <= limit else text[: limit - len(CUT_NOTE)] + CUT_NOTE
