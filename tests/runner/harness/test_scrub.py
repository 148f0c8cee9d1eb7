"""Credential and path scrubbing of text that reaches verdicts, build logs and pull requests."""

from __future__ import annotations

import pytest

from runner.harness.scrub import PATH_PLACEHOLDER, REDACTED, environment_secrets, looks_secret, scrub

GH = "ghp_" + "Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0Lm9Nb8"
PEM = ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
       "QyNTUxOQ==\n-----END OPENSSH PRIVATE KEY-----")


@pytest.mark.parametrize("secret", [
    GH,
    "gho_" + "a" * 10 + "B" * 10 + "1" * 16,
    "ghs_16C7e42F292c6912E7710c838347Ae178B4a",
    "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJK",
    "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z",
    "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    "AKIAIOSFODNN7EXAMPLE",
    "xoxb-123456789012-abcdefghijkl",
    "Q2hhbmdlIHRoaXMhIFRoaXMgaXMgYSByYW5kb20ga2V5IDEyMzQ1Njc4OTA",  # a long base64 blob
])
def test_credentials_are_redacted_wherever_they_appear(secret):
    text = f"error: unknown identifier '{secret}' at line 3"
    out = scrub(text, known_secrets=[])
    assert secret not in out and REDACTED in out and "at line 3" in out


def test_pem_blocks_headers_and_url_credentials_are_redacted():
    text = (f"{PEM}\nAuthorization: Bearer abc.def.ghi\nAuthorization: token 0123456789abcdef\n"
            "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n"
            "remote: https://x-access-token:s3cr3tvalue@github.com/o/r.git\n")
    out = scrub(text, known_secrets=[])
    for leaked in ("b3BlbnNz", "abc.def.ghi", "0123456789abcdef", "wJalrXUtnFEMI", "s3cr3tvalue"):
        assert leaked not in out, out
    assert "github.com/o/r.git" in out


def test_a_pem_block_cut_by_the_tail_is_still_redacted():
    tail = PEM[PEM.index("\n") + 5:]  # starts inside the block
    assert "QyNTUxOQ" not in scrub(tail, known_secrets=[])


def test_known_secret_values_and_the_environments_credentials_are_redacted(monkeypatch):
    monkeypatch.setenv("MY_DEPLOY_PASSWORD", "hunter2hunter2")
    assert "hunter2hunter2" in environment_secrets()
    assert "hunter2hunter2" not in scrub("login with hunter2hunter2 ok")
    assert scrub("value=plainword", known_secrets=["plainword"]) == f"value={REDACTED}"


def test_paths_outside_the_job_are_replaced_and_inside_made_relative(tmp_path):
    job = tmp_path / "build-1234"
    text = (f"{job}/k.cpp:3:1: error: expected ';'\n"
            f"In file included from /root/.git-credentials:1,\n/usr/include/c++/12/vector: note\n"
            "see https://gcc.gnu.org/bugs/ and a/b ratio 1/2")
    out = scrub(text, job_dirs=[job], known_secrets=[])
    assert out.startswith("k.cpp:3:1: error") and "/root" not in out and "/usr/include" not in out
    assert out.count(PATH_PLACEHOLDER) == 2 and "https://gcc.gnu.org/bugs/" in out and "a/b ratio 1/2" in out


def test_ordinary_compiler_and_python_text_is_kept():
    text = ("sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 kernel\n"
            "undefined reference to `_ZN3c1010TensorImpl17set_storage_offsetEl'\n"
            "AssertionError: max abs diff 0.0123 at index (3, 17) over atol 1e-4\n"
            "TORCH_EXTENSIONS_DIR fusebot_forward fb_tensor\n")
    assert scrub(text, known_secrets=[]) == text


def test_the_length_is_limited_from_the_end_kept():
    out = scrub("a" * 100 + "END", limit_chars=20, known_secrets=[])
    assert len(out) == 20 and out.endswith("END")
    head = scrub("BEGIN" + "a" * 100, limit_chars=20, known_secrets=[], keep="head")
    assert len(head) == 20 and head.startswith("BEGIN")


def test_looks_secret_takes_tokens_not_settings():
    assert looks_secret(GH) and looks_secret(PEM)
    assert not looks_secret("/usr/local/cuda/bin:/usr/bin") and not looks_secret("1") and not looks_secret("en_US.UTF-8")


# A crashing candidate's message that erased fusebot's "rejected" line on a terminal and printed its own verdict.
FORGED_LINE = "boom\x1b[1A\x1b[2K\rcorrect, 12.00x\x9b2K\x07\x08\x00 done\n\tnext line"


def test_control_characters_but_newline_and_tab_are_removed():
    from runner.contract import inert

    assert inert(FORGED_LINE) == "boom[1A[2Kcorrect, 12.00x2K done\n\tnext line"
    assert scrub(FORGED_LINE, known_secrets=[]) == inert(FORGED_LINE)


def test_a_verdict_carries_no_control_character_into_its_json_or_a_published_text():
    from bot.logs import redact
    from runner.contract import Verdict

    v = Verdict(candidate_id="c", problem="p", accepted=False, reasons=["runtime: " + FORGED_LINE])
    v.warnings.append(FORGED_LINE)  # appended after construction, as the harness does: made inert when written
    dumped = v.model_dump_json()
    assert "\\u001b" not in dumped and "\\r" not in dumped and "\\u009b" not in dumped
    assert "\x1b" not in Verdict.model_validate_json(dumped).warnings[0]
    assert "\x1b" not in redact(FORGED_LINE) and "\r" not in redact(FORGED_LINE)
