"""Extraction of ideas and code from free-form answers (runner/proposers/llm/extract.py)."""

from runner.proposers.llm.extract import extract_code, extract_ideas

KERNEL = '#include "fusebot.h"\nFB_EXPORT int fusebot_forward(const fb_tensor* in, int32_t n_in, fb_tensor* out,\n' \
         '    int32_t n_out, void* stream) {\n  return 0;\n}\n'


def test_ideas_from_a_numbered_list_with_bold_titles_and_continuation_lines():
    text = """Let me think about where the time goes.

1. **Vectorized loads**: read float4 per thread
   so each warp moves 512 bytes per transaction.
2) Fuse the bias add into the ReLU pass.
3. Use one block per row with an online reduction.

That's all."""
    assert extract_ideas(text, 5) == [
        "Vectorized loads: read float4 per thread so each warp moves 512 bytes per transaction.",
        "Fuse the bias add into the ReLU pass.",
        "Use one block per row with an online reduction.",
    ]
    assert len(extract_ideas(text, 2)) == 2


def test_ideas_from_json_in_a_fence_and_from_bullets_and_from_paragraphs():
    j = 'Sure:\n```json\n{"ideas": [{"idea": "tile the rows across warps"}, "use fast exp intrinsics"]}\n```'
    assert extract_ideas(j, 4) == ["tile the rows across warps", "use fast exp intrinsics"]
    b = "Ideas:\n- unroll the inner loop by four\n* keep the running max in registers\n"
    assert extract_ideas(b, 4) == ["unroll the inner loop by four", "keep the running max in registers"]
    p = "Fuse both elementwise passes into a single sweep over memory.\n\nAlso use streaming stores for output."
    assert extract_ideas(p, 4) == ["Fuse both elementwise passes into a single sweep over memory.",
                                   "Also use streaming stores for output."]
    assert extract_ideas("ok", 3) == []


def test_ideas_ignore_numbers_inside_code_blocks():
    text = "1. First real idea here\n```cpp\n2. not an idea\n```\n2. Second real idea here"
    assert extract_ideas(text, 5) == ["First real idea here", "Second real idea here"]


def test_code_takes_the_largest_block_that_defines_the_entry_point_with_any_c_tag():
    for tag in ("cpp", "c++", "cuda", "cu", "", "CPP"):
        text = f"Explanation.\n```{tag}\n{KERNEL}```\nAnd a helper:\n```cpp\nint helper();\n```"
        code, why = extract_code(text, "fast")
        assert code == KERNEL and why == ""
    bigger = KERNEL.replace("return 0;", "/* a longer version */\n  return 0;")
    code, _ = extract_code(f"```cpp\n{KERNEL}```\nbetter:\n```cuda\n{bigger}```", "fast")
    assert code == bigger


def test_code_refuses_answers_without_usable_code_and_says_why():
    assert extract_code("I would use float4 loads.", "fast") == (None, "no fenced code block in the answer")
    code, why = extract_code("```python\nclass ModelNew: pass\n```", "fast")
    assert code is None and "fusebot_forward" in why and "python" in why
    code, why = extract_code("```cpp\nint fusebot_forward(void) {\n  if (1) {\n", "fast")  # cut off mid-answer
    assert code is None and "cut off" in why


def test_kernelbench_code_needs_model_new_in_a_python_block():
    text = "```python\nimport torch\nclass ModelNew(torch.nn.Module):\n    pass\n```"
    code, _ = extract_code(text, "kernelbench")
    assert code.startswith("import torch") and "ModelNew" in code
    assert extract_code(f"```cpp\n{KERNEL}```", "kernelbench")[0] is None
