"""The LLM proposer: ideas, implementations and repairs from any OpenAI-compatible endpoint.

One `LLMProposer` per model; `llm_proposers(settings)` gives each configured model with its share of the branches,
all on one client. Retries are tenacity's alone (the openai client's own are off): exponential backoff with jitter on
429, 5xx, timeouts and dropped connections, waiting what Retry-After says when the server says it. Every answer goes
through the search's session: cached by a hash of the prompt (a resumed search replays it for free) and counted
against the token budget, which is checked before each request so the search stops before exceeding it.
The API key lives in a SecretStr and goes nowhere but the client's Authorization header.
"""

from __future__ import annotations

import email.utils
import json
import logging
import math
import time
from functools import cached_property
from importlib import resources
from typing import Annotated, Any

import openai
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from runner.contract import Candidate, Verdict
from runner.proposers.llm import prompts
from runner.proposers.llm.extract import extract_code, extract_ideas
from runner.search.types import (
    Answer,
    BudgetExhausted,
    History,
    Idea,
    ProblemContext,
    ProposerUnavailable,
    Session,
    prompt_key,
)

log = logging.getLogger(__name__)

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


def estimate_tokens(messages: prompts.Messages) -> int:
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


class LLMProposer:
    """A Proposer backed by one model of an OpenAI-compatible endpoint."""

    remote = True  # answers over the network: builtin proposers seed the first beam before it is asked

    def __init__(self, settings: LLMSettings, model: str, client: openai.OpenAI | None = None):
        self.settings = settings
        self.model = model
        self.name = model
        self.client = client or make_client(settings)
        self.session = Session()

    @cached_property
    def abi_header(self) -> str:
        return resources.files("runner").joinpath("csrc/fusebot.h").read_text()

    def bind(self, session: Session) -> None:
        self.session = session

    # ---- one request -------------------------------------------------------------------------------------------
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

    def complete(self, messages: prompts.Messages, purpose: str) -> Answer | None:
        """The model's answer (from the cache when this exact prompt was answered before), or None when the request
        failed in a way a retry cannot fix (a 4xx). Raises BudgetExhausted before a request the budget cannot
        afford, ProposerUnavailable when retries ran out."""
        s = self.settings
        key = prompt_key(self.model, s.temperature, purpose, messages)
        if (cached := self.session.cached(key)) is not None:
            return cached
        prompt_est = estimate_tokens(messages)
        max_out = s.max_completion_tokens
        left = self.session.tokens_left()
        if left is not None:
            if left - prompt_est < s.min_completion_tokens:
                raise BudgetExhausted("tokens", f"{self.session.tokens_used} used of {self.session.tokens_limit}, "
                                      f"the next request needs about {prompt_est + s.min_completion_tokens}")
            max_out = min(max_out, left - prompt_est)
        retrying = Retrying(retry=retry_if_exception(retryable), wait=self._wait,
                            stop=stop_after_attempt(s.max_attempts), before_sleep=self._log_retry, reraise=True)
        try:
            response = retrying(self.client.chat.completions.create, model=self.model, messages=messages,
                                temperature=s.temperature, max_completion_tokens=max_out)
        except openai.APIStatusError as e:
            if retryable(e) or e.status_code in (401, 403, 404):
                raise ProposerUnavailable(f"{self.model}: HTTP {e.status_code} after {s.max_attempts} tries") from e
            log.warning("%s: request rejected with HTTP %d; counted as a failed attempt", self.model, e.status_code)
            return None
        except openai.APIConnectionError as e:
            raise ProposerUnavailable(f"{self.model}: {type(e).__name__} after {s.max_attempts} tries") from e
        text = (response.choices[0].message.content or "") if response.choices else ""
        usage = response.usage
        pt = usage.prompt_tokens if usage else prompt_est
        ct = usage.completion_tokens if usage else math.ceil(len(text) / 3)
        answer = Answer(key=key, text=text, prompt_tokens=pt, completion_tokens=ct, cost_usd=s.cost_usd(pt, ct),
                        model=self.name)
        self.session.charge(answer)
        log.info("%s: %s answered (%d + %d tokens; %d used in this search)", self.model, purpose, pt, ct,
                 self.session.tokens_used)
        return answer

    # ---- the Proposer interface ---------------------------------------------------------------------------------
    def ideas(self, ctx: ProblemContext, history: History, n: int) -> list[Idea]:
        answer = self.complete(prompts.ideas_prompt(ctx, history, n), "ideas")
        texts = extract_ideas(answer.text, n) if answer else []
        if not texts:
            self.session.failed(Idea(text="(ideas)", proposer=self.name), f"{self.model}: no ideas in the answer")
        return [Idea(text=t, proposer=self.name) for t in texts]

    def _candidate(self, ctx: ProblemContext, idea: Idea, answer: Answer | None,
                   parent: str | None) -> Candidate | None:
        if answer is None:
            self.session.failed(idea, f"{self.model}: the request was rejected")
            return None
        code, why = extract_code(answer.text, ctx.format)
        if code is None:
            self.session.failed(idea, f"{self.model}: {why}")
            return None
        return Candidate(id=f"{self.name}-{answer.key[:12]}", format=ctx.format, backend=ctx.backend,
                         sources={prompts.source_filename(ctx): code}, idea=idea.text, parent=parent)

    def implement(self, ctx: ProblemContext, idea: Idea, history: History, n: int) -> list[Candidate]:
        out = []
        for k in range(n):
            messages = prompts.implement_prompt(ctx, idea, history, self.abi_header, variant=k, variants=n)
            c = self._candidate(ctx, idea, self.complete(messages, "implement"), None)
            if c is not None:
                out.append(c)
        return out

    def repair(self, ctx: ProblemContext, candidate: Candidate, verdict: Verdict) -> Candidate | None:
        messages = prompts.repair_prompt(ctx, candidate, verdict, self.abi_header)
        idea = Idea(text=candidate.idea, proposer=self.name)
        return self._candidate(ctx, idea, self.complete(messages, "repair"), candidate.id)


def llm_proposers(settings: LLMSettings) -> list[tuple[LLMProposer, float]]:
    """One proposer per configured model, with its share of the branches, sharing one client."""
    client = make_client(settings)
    return [(LLMProposer(settings, m.name, client), m.share) for m in settings.models]
