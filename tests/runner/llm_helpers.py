"""Shared pieces of the LLM proposer tests: settings against the scripted server, scripted answers."""

from __future__ import annotations

from runner.proposers.llm.proposer import LLMSettings

SECRET = "sk-test-SECRET-4242-do-not-leak"


def settings(url: str, **kw) -> LLMSettings:
    base = dict(base_url=url, api_key=SECRET, models="scripted-a", timeout_s=5.0, backoff_initial_s=0.01,
                backoff_max_s=3.0, max_attempts=4, max_completion_tokens=2000, min_completion_tokens=100,
                max_concurrency=1)  # one request at a time: scripted answers go to requests in a known order
    return LLMSettings(**(base | kw))


def code_answer(marker: str, tag: str = "cpp") -> str:
    return (
        "The idea: fuse everything into one pass.\n\n"
        f"```{tag}\n#include \"fusebot.h\"\n// FAKE: {marker}\n"
        "FB_EXPORT int fusebot_forward(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out,\n"
        "                              void* stream) {\n  return 0;\n}\n```\n"
    )


IDEAS = "Here are my ideas:\n1. Vectorize loads with float4 and fuse the bias.\n2. Process two rows per thread block.\n"
