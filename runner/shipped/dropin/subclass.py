"""The drop-in's class (the last part of every drop-in): a subclass of the original with the kernel in its forward.
The generator writes the class's name for `__NAME__`, the kernel's file for `__KERNEL__`, the custom op's name for
`__OP__` and the target's for `__TARGET__`.
"""

import sys

import torch

from runner.shipped.dropin.adopt import _ADOPTING
from runner.shipped.dropin.forward import _eager, _slots, _state, _traced
from runner.shipped.dropin.guard import _REFERENCE
from runner.shipped.dropin.head import Original

# ---- the drop-in from here on


class __NAME__(Original):
    """__NAME__ with its forward computed by the fused kernel in __KERNEL__ (found and verified by fusebot).

    Same constructor, state_dict and forward signature as the original, so its checkpoints and calls work unchanged.
    The kernel runs where a call is one it was verified for (device, dtype, rank, sizes; inference: no gradients
    wanted); every other call runs the original forward (a FallbackWarning once per reason). torch.compile calls the
    kernel as the custom op `__OP__`; jit.script, jit.trace, fx.symbolic_trace and vmap get the original forward.
    Switch it off with FUSEBOT_DISABLE=1 (every drop-in), FUSEBOT_DISABLE=__TARGET__ (this one), or
    `__NAME__.fusebot_enabled = False` (the class, or one instance).
    """

    kernel_calls = 0
    fusebot_enabled = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _slots(self)

    def _fusebot_state(self):
        return _state(self)

    def forward(self, *args, **kwargs):
        if getattr(_REFERENCE, "on", 0):
            return Original.forward(self, *args, **kwargs)
        if torch.compiler.is_compiling():
            return _traced(self, args, kwargs)
        return _eager(self, args, kwargs)

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_fusebot_plans", None)
        return state

    def __prepare_scriptable__(self):
        """torch.jit.script compiles the original class's forward: TorchScript cannot call the kernel."""
        plain = Original.__new__(Original)
        plain.__dict__.update({k: v for k, v in self.__dict__.items() if not k.startswith("_fusebot_")})
        return plain


__NAME__.forward.__wrapped__ = Original.forward  # the original's signature (inspect, fx.symbolic_trace)


def _count():
    __NAME__.kernel_calls += 1


__NAME__.fusebot_original = Original  # the class it replaces (a module that adopted it binds that name to this one)
_DROPIN = __NAME__
for _name in _ADOPTING:  # modules that adopted it while it loaded: their name now binds the subclass
    if getattr(sys.modules.get(_name), "__NAME__", None) is Original:
        setattr(sys.modules[_name], "__NAME__", __NAME__)
