"""One model of an OpenAI-compatible endpoint: its settings and one request.

Retries are tenacity's alone (the openai client's own are off): exponential backoff with jitter on 429, 5xx, timeouts
and dropped connections, waiting what Retry-After says when the server says it. Every answer goes through the search's
session: cached by a hash of the prompt (a resumed search replays it for free) and counted against the token budget,
whose room is reserved before the request is sent, so concurrent requests stop the search before it is exceeded. At
most `max_concurrency` requests of one model are in flight at once. A prompt the endpoint refuses as longer than the
model's context raises `PromptTooLong` (the proposer shrinks it), not a failed attempt. The API key lives in a
SecretStr and goes nowhere but the client's Authorization header.
"""

from __future__ import annotations

import email.utils
import json
import logging
import math
import threading
import time
from typing import Annotated, Any

import openai
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from runner.search.types import Answer, ProposerUnavailable, Session, prompt_key

log = logging.getLogger(__name__)

Messages = list[dict[str, str]]

_PLACEHOLDER_KEYS = {"", "changeme", "change-me", "your-api-key", "your_api_key", "sk-...", "xxx", "todo"}


class ModelShare(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    share: float = Field(default=1.0, gt=0)


class LLMSettings(BaseSettings):
    """FUSEBOT_LLM_BASE_URL, FUSEBOT_LLM_API_KEY, FUSEBOT_LLM_MODELS ("o3:2,gemini-2.5-pro:1" or JSON), ..."""

    model_config = SettingsConfigDict(env_prefix="FUSEBOT_LLM_", extra="forbid")

    base_url: str
    api_key: SecretStr
    models: Annotated[list[ModelShare], NoDecode] = Field(min_length=1)
    temperature: float = Field(default=0.8, ge=0, le=2)
    timeout_s: float = Field(default=300.0, gt=0)
    max_attempts: int = Field(default=6, ge=1)  # tries per request, the first included
    backoff_initial_s: float = Field(default=2.0, ge=0)
    backoff_max_s: float = Field(default=120.0, ge=0)
    max_completion_tokens: int = Field(default=16_384, ge=64)
    min_completion_tokens: int = Field(default=512, ge=1)  # a request with less room than this is not sent
    price_per_1k_prompt_usd: float | None = Field(default=None, ge=0)
    price_per_1k_completion_usd: float | None = Field(default=None, ge=0)
    max_concurrency: int = Field(default=4, ge=1)  # requests of one model in flight at once

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"must be an http(s) URL of an OpenAI-compatible API, e.g. https://host/v1 (got {v!r})")
        return v.rstrip("/")

    @field_validator("api_key")
    @classmethod
    def _key(cls, v: SecretStr) -> SecretStr:
        if v.get_secret_value().strip().lower() in _PLACEHOLDER_KEYS:
            raise ValueError("is empty or a placeholder; set FUSEBOT_LLM_API_KEY to a real key")
        return v

    @field_validator("models", mode="before")
    @classmethod
    def _models(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = v.strip()
            if v.startswith("["):
                return json.loads(v)
            out = []
            for part in filter(None, (p.strip() for p in v.split(","))):
                name, _, share = part.rpartition(":")
                try:
                    out.append({"name": name, "share": float(share)} if name else {"name": part})
                except ValueError:  # a colon inside the model's name, e.g. "llama3:70b"
                    out.append({"name": part})
            return out
        return v

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * (self.price_per_1k_prompt_usd or 0.0)
                + completion_tokens * (self.price_per_1k_completion_usd or 0.0)) / 1000


def estimate_tokens(messages: Messages) -> int:
    """A deliberately high estimate (3 characters a token) of a prompt's size, to stay inside the budget."""
    return sum(math.ceil(len(m["content"]) / 3) + 8 for m in messages)


def retry_after_s(exc: BaseException) -> float | None:
    """Seconds the server asked us to wait (Retry-After as seconds or an HTTP date, or retry-after-ms), if any."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if not headers:
        return None
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def retryable(exc: BaseException) -> bool:
    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError
        return True
    return isinstance(exc, openai.APIStatusError) and (exc.status_code in (408, 409, 429) or exc.status_code >= 500)


def make_client(settings: LLMSettings) -> openai.OpenAI:
    return openai.OpenAI(base_url=settings.base_url, api_key=settings.api_key.get_secret_value(),
                         timeout=settings.timeout_s, max_retries=0)


class PromptTooLong(Exception):  # noqa: N818 - a signal to shrink the prompt, not an error
    """The endpoint refused the prompt as longer than the model's context."""


_CONTEXT_WORDS = ("context length", "context_length", "maximum context", "context window", "too many tokens",
                  "prompt is too long", "input is too long", "reduce the length")


def context_too_long(exc: BaseException) -> bool:
    """A 400/413 whose error says the prompt exceeds the model's context (OpenAI's code context_length_exceeded, or
    the words vLLM, Anthropic's and Google's compatible APIs use)."""
    if not isinstance(exc, openai.APIStatusError) or exc.status_code not in (400, 413, 422):
        return False
    body = exc.body if isinstance(exc.body, dict) else {}
    if body.get("code") == "context_length_exceeded":
        return True
    text = f"{exc.message} {body.get('message', '')}".lower()
    return any(w in text for w in _CONTEXT_WORDS)


class Endpoint:
    """Requests to one model: cached, budgeted, bounded in concurrency, retried."""

    def __init__(self, settings: LLMSettings, model: str, client: openai.OpenAI, session: Session):
        self.settings, self.model, self.client, self.session = settings, model, client, session
        self._slots = threading.BoundedSemaphore(settings.max_concurrency)

    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        asked = retry_after_s(exc) if exc else None
        if asked is not None:
            return min(asked, self.settings.backoff_max_s)
        return wait_random_exponential(multiplier=self.settings.backoff_initial_s, max=self.settings.backoff_max_s)(
            state)

    def _log_retry(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning("%s: request failed (%s: %s); retry %d in %.1f s", self.model, type(exc).__name__,
                    getattr(exc, "status_code", "") or "", state.attempt_number,
                    state.next_action.sleep if state.next_action else 0.0)

    def complete(self, messages: Messages, purpose: str) -> Answer | None:
        """The model's answer (from the cache when this exact prompt was answered before), or None when the request
        failed in a way a retry cannot fix (a 4xx). Raises BudgetExhausted before a request the budget cannot
        afford, PromptTooLong when the endpoint says the prompt exceeds the context, ProposerUnavailable when
        retries ran out."""
        s = self.settings
        key = prompt_key(self.model, s.temperature, purpose, messages)
        if (cached := self.session.cached(key)) is not None:
            return cached
        prompt_est = estimate_tokens(messages)
        reserved = self.session.reserve(prompt_est + s.min_completion_tokens, prompt_est + s.max_completion_tokens)
        try:
            max_out = min(s.max_completion_tokens, reserved - prompt_est)
            retrying = Retrying(retry=retry_if_exception(retryable), wait=self._wait,
                                stop=stop_after_attempt(s.max_attempts), before_sleep=self._log_retry, reraise=True)
            with self._slots:
                t0 = time.monotonic()
                try:
                    response = retrying(self.client.chat.completions.create, model=self.model, messages=messages,
                                        temperature=s.temperature, max_completion_tokens=max_out)
                except openai.APIStatusError as e:
                    if context_too_long(e):
                        raise PromptTooLong(f"{self.model}: HTTP {e.status_code}: the prompt (about {prompt_est} "
                                            "tokens) exceeds the model's context") from e
                    if retryable(e) or e.status_code in (401, 403, 404):
                        raise ProposerUnavailable(f"{self.model}: HTTP {e.status_code} after {s.max_attempts} "
                                                  "tries") from e
                    log.warning("%s: request rejected with HTTP %d; counted as a failed attempt", self.model,
                                e.status_code)
                    return None
                except openai.APIConnectionError as e:
                    raise ProposerUnavailable(f"{self.model}: {type(e).__name__} after {s.max_attempts} tries") from e
                seconds = time.monotonic() - t0
            answer = self._answer(key, response, prompt_est, seconds)
            self.session.charge(answer)
        finally:
            self.session.release(reserved)
        log.info("%s: %s answered in %.1f s (%d + %d tokens, %s; %d used in this search)", self.model, purpose,
                 answer.seconds, answer.prompt_tokens, answer.completion_tokens, answer.finish_reason,
                 self.session.tokens_used)
        return answer

    def _answer(self, key: str, response: Any, prompt_est: int, seconds: float) -> Answer:
        choice = response.choices[0] if response.choices else None
        text = (choice.message.content or "") if choice else ""
        extra = (choice.message.model_extra or {}) if choice else {}
        reasoning = extra.get("reasoning_content") or extra.get("reasoning") or ""
        usage = response.usage
        pt = usage.prompt_tokens if usage else prompt_est
        ct = usage.completion_tokens if usage else math.ceil((len(text) + len(reasoning)) / 3)
        reported = (usage.model_extra or {}).get("cost") if usage else None  # OpenRouter and others bill per answer
        cost = float(reported) if isinstance(reported, int | float) else self.settings.cost_usd(pt, ct)
        return Answer(key=key, text=text, prompt_tokens=pt, completion_tokens=ct, cost_usd=cost, model=self.model,
                      finish_reason=(choice.finish_reason or "stop") if choice else "no choice",
                      reasoning_chars=len(reasoning) if isinstance(reasoning, str) else 0, seconds=seconds)
