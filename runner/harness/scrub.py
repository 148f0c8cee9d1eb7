"""Scrubbing text that came from an untrusted process before fusebot shows or publishes it.

Build errors, a child's log tail and a verdict's reasons end up in a pull request's search trace. A candidate that
reads a credential (or makes the compiler quote one) must not get it published: `scrub()` replaces anything that looks
like a credential, every known secret value, and every absolute path outside the job's own directory with a
placeholder, and limits the length.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping

from runner.contract import inert

REDACTED = "[redacted]"
PATH_PLACEHOLDER = "<path>"
DEFAULT_LIMIT_CHARS = 4000

_PEM = re.compile(r"-----BEGIN [A-Z0-9 ]+-----.*?(?:-----END [A-Z0-9 ]+-----|\Z)", re.S)
_PEM_END = re.compile(r"\A.*?-----END [A-Z0-9 ]+-----", re.S)  # a tail that starts inside a block
_PATTERNS = [
    re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"),  # GitHub tokens
    re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}"),  # OpenAI / Anthropic style API keys
    re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b"),  # AWS access key ids
    re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),  # Slack
    re.compile(r"\bAIza[0-9A-Za-z_\-]{30,}"),  # Google API keys
    re.compile(r"\beyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]*"),  # JWTs
]
# `Authorization: Bearer ...`, `aws_secret_access_key = ...`, `password=...`, `"api_key": "..."`: the value goes.
_ASSIGNED = re.compile(
    r"(?i)((?:authorization|proxy-authorization|x-api-key|api[_-]?key|secret[_-]?access[_-]?key|secret|password|passwd"
    r"|token|private[_-]?key|client[_-]?secret)[\"']?\s*[:=]\s*[\"']?)([^\s\"',;]+(?:[ \t]+[^\s\"',;]+)?)")
_URL_CREDENTIALS = re.compile(r"(\b[a-z][a-z0-9+.\-]*://)[^/\s:@]+:[^/\s@]+@")  # https://user:token@host
_WORDS = re.compile(r"[a-z]{3,}")
_CANDIDATE_WORD = re.compile(r"[A-Za-z0-9+/_\-=]{32,}")
_ABS_PATH = re.compile(r"(?<![\w.:/~\-\\])/(?:[\w.@+\-]+/)*[\w.@+\-]+/?")
_SECRET_NAMES = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL", "AUTH", "COOKIE", "SESSION")


def _entropy_bits(word: str) -> float:
    counts = Counter(word)
    n = len(word)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def _high_entropy(word: str) -> bool:
    """A long random-looking string (a key, a token): mixed case and digits, near-uniform characters. Hex digests
    (lower case and digits only) and identifiers such as C++ mangled names are not taken for keys."""
    core = word.strip("=")
    if len(core) < 32:
        return False
    upper = sum(c.isupper() for c in core)
    lower = sum(c.islower() for c in core)
    digits = sum(c.isdigit() for c in core)
    if upper < 3 or lower < 3 or digits < 3 or core.startswith("_Z"):  # (_Z...: a C++ mangled name)
        return False
    # Identifiers are made of words: half of their characters in runs of 3+ lower-case letters (random base62 or
    # base64 of that length: under 0.1% of them)
    if sum(len(w) for w in _WORDS.findall(core)) >= len(core) / 2:
        return False
    return _entropy_bits(core) >= 4.0


def looks_secret(value: str) -> bool:
    """Whether a whole value (an environment variable's, say) looks like a credential."""
    v = value.strip()
    if not v or len(v) > 8192:
        return False
    if _PEM.search(v) or any(p.search(v) for p in _PATTERNS):
        return True
    return bool(_CANDIDATE_WORD.fullmatch(v)) and _high_entropy(v)


def secret_name(name: str) -> bool:
    """Whether an environment variable's name says it holds a credential."""
    upper = name.upper()
    return any(s in upper for s in _SECRET_NAMES)


def environment_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """The values of this process's environment variables that are credentials (by name or by look)."""
    env = os.environ if environ is None else environ
    return [v for k, v in env.items() if len(v) >= 8 and (secret_name(k) or looks_secret(v))]


def _paths(text: str, job_dirs: tuple[str, ...]) -> str:
    def one(m: re.Match) -> str:
        path = m.group(0)
        for d in job_dirs:
            if path == d or path == d + "/":
                return "."
            if path.startswith(d + "/"):
                return path[len(d) + 1 :]
        return PATH_PLACEHOLDER

    return _ABS_PATH.sub(one, text)


def scrub(text: str, *, known_secrets: Iterable[str] | None = None, job_dirs: Iterable[str | os.PathLike] = (),
          limit_chars: int = DEFAULT_LIMIT_CHARS, keep: str = "tail") -> str:
    """`text` fit to show: credentials and secret values redacted, absolute paths outside `job_dirs` replaced by
    PATH_PLACEHOLDER (those inside made relative), at most `limit_chars` characters (the `keep` end, "head" or
    "tail"). `known_secrets` defaults to the credentials in this process's environment."""
    if not text:
        return ""
    text = inert(text)
    secrets = environment_secrets() if known_secrets is None else list(known_secrets)
    for s in sorted({s for s in secrets if s and len(s) >= 6}, key=len, reverse=True):
        text = text.replace(s, REDACTED)
    text = _PEM.sub(REDACTED, text)
    if "-----END " in text:
        text = _PEM_END.sub(REDACTED, text)
    text = _URL_CREDENTIALS.sub(lambda m: m.group(1) + REDACTED + "@", text)
    text = _ASSIGNED.sub(lambda m: m.group(1) + REDACTED, text)
    for p in _PATTERNS:
        text = p.sub(REDACTED, text)
    text = _CANDIDATE_WORD.sub(lambda m: REDACTED if _high_entropy(m.group(0)) else m.group(0), text)
    dirs = tuple(sorted({os.path.realpath(d) for d in job_dirs} | {os.fspath(d).rstrip("/") for d in job_dirs},
                        key=len, reverse=True))
    text = _paths(text, dirs)
    if len(text) > limit_chars:
        cut = "[... cut ...]"
        text = cut + text[-(limit_chars - len(cut)):] if keep == "tail" else text[: limit_chars - len(cut)] + cut
    return text
