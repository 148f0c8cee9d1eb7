"""The kernel ABI's dtype codes (fb_tensor.dtype): the one source. runner/harness/procs/abi.py maps torch dtypes
through it, the catalog's generated checks (runner/catalog/codegen/head.py) and every drop-in's guard
(runner/shipped/dropin/guard.py) are written from it, and tests/test_layout.py holds runner/csrc/fusebot.h's
`enum fb_dtype` to it. Torch-free: a torch dtype's name is the key (`getattr(torch, name)`)."""

import textwrap

ABI_DTYPES: dict[str, int] = {
    "float32": 0,
    "float16": 1,
    "bfloat16": 2,
    "float64": 3,
    "int32": 4,
    "int64": 5,
    "bool": 6,
    "uint8": 7,
    "int8": 8,
}


def guard_table() -> str:
    """The drop-in guard's `_DTYPES` literal (torch dtype -> code), as Python source wrapped to 120 columns after
    `_DTYPES = `."""
    text = "{" + ", ".join(f"torch.{name}: {code}" for name, code in ABI_DTYPES.items()) + "}"
    return "\n".join(textwrap.wrap(text, 120, initial_indent=" " * 10, subsequent_indent=" " * 11)).lstrip()
