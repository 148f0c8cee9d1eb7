"""Stand-ins for what the generator writes at the top of every drop-in (runner/harness/dropin.py: its per-PR
constants, and `_ref` and `Original`, the reference module and the class the drop-in subclasses), so that the parts
of this package import and run on their own: a CPU kernel of a one-layer module. Nothing here ships."""

from pathlib import Path
from types import ModuleType

import torch

_HERE = Path(__file__).resolve().parent
KERNEL = "kernel.cpp"
BACKEND = "cpu"
FLAGS: list[str] = []
BUILT_FOR = "cpu"
BUILT_ARCH = ""
SHIPPED: dict[str, tuple[str, str]] = {}  # arch -> (file beside the drop-in, sha256 of the library)
DEVICE_CODE: dict[str, tuple[str, str]] = {}  # arch -> (cubin or PTX beside the drop-in, sha256 of its bytes)
PLANS: list[dict] = []  # per verified call: the steps its host code launched
TARGET = "target"
OP_NAME = "fusebot::target_00000000"
SINGLE_OUTPUT = True
PROBLEM = {"inputs": "get_inputs", "second_inputs": None, "input_shapes": None, "dtype": None,
           "init_inputs": "get_init_inputs", "init_args": [], "init_kwargs": {}}

_ref = ModuleType("reference")
Original = torch.nn.Linear
