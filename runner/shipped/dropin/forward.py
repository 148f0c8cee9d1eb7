"""The drop-in's forward (a part of every drop-in, before its class).

The forward keeps the original's signature (`forward.__wrapped__`: inspect.signature, keyword calls, and what
fx.symbolic_trace reads) and holds no registry of modules, so deepcopy and pickling (torch.save of the whole module,
loaded in another process) need nothing but the drop-in importable. Three paths:
- eager: the guard (guard.py), then the kernel called directly through ctypes (no dispatch); the guard's verdict
  and the kernel path (call.py `_Call`) are made once per call signature (the tensors' dtypes, shapes, strides,
  devices and layouts), and what is not part of it (FUSEBOT_DISABLE, gradients, training mode, tracing, the
  module's current tensors) is checked at every call;
- torch.compile: the same checks on the traced tensors, then the custom op with the original's output layout (the
  original forward is traced only for its output shapes; the compiled graph does not use its values);
- the original forward: autograd wanting gradients, jit.trace, fx.symbolic_trace, vmap and other torch.func
  transforms, jit.script (`__prepare_scriptable__` hands TorchScript the original class), and whatever the guard
  refuses.
"""

import inspect

import torch
import torch.fx

from runner.shipped.dropin.adopt import _env_off
from runner.shipped.dropin.call import KernelError, _Call, _run, fused
from runner.shipped.dropin.guard import _CODES, _DTYPES, STRICT, _note, _plan, _size_miss, _sizes, _verified
from runner.shipped.dropin.head import BACKEND, TARGET, Original
from runner.shipped.dropin.runtime import BuildError

# ---- the drop-in from here on


_PLAIN = (torch.Tensor, torch.nn.Parameter)
_PROXY = torch.fx.Proxy
_NUMBERS = {"bool": (bool, torch.bool), "int": (int, torch.int64), "float": (float, torch.float32)}


def _slots(module):
    """The module's state_dict names and where each tensor lives (submodule path, name), computed once."""
    slots = module.__dict__.get("_fusebot_slots")
    if slots is None:
        names = list(module.state_dict(keep_vars=True))
        slots = [(tuple(n.split(".")[:-1]), n.split(".")[-1]) for n in names]
        module.__dict__["_fusebot_state_names"] = names
        module.__dict__["_fusebot_slots"] = slots
    return slots


def _names(module):
    _slots(module)
    return module.__dict__["_fusebot_state_names"]


def _state(module):
    """The module's tensors in state_dict order, looked up where they live now (a replaced parameter or submodule
    is seen), without walking every submodule as named_parameters() does."""
    out = []
    for path, leaf in _slots(module):
        m = module
        for p in path:
            m = m._modules[p]
        t = m._parameters.get(leaf)
        out.append(t if t is not None else m._buffers[leaf])
    return out


_ACTIVE = getattr(torch._C, "_are_functorch_transforms_active", None)


def _transformed():
    return bool(_ACTIVE is not None and _ACTIVE())


def _code_names(code):
    names = set(code.co_names)
    for c in code.co_consts:
        if hasattr(c, "co_names"):
            names |= _code_names(c)
    return names


def _train_dependent(module):
    """A submodule whose forward behaves differently in training mode (dropout, batch norm, a forward reading
    `self.training`), by class name; None when there is none."""
    for m in module.modules():
        if isinstance(m, (torch.nn.modules.dropout._DropoutNd, torch.nn.modules.batchnorm._NormBase)):
            return type(m).__name__
        code = getattr(inspect.unwrap(type(m).forward), "__code__", None)
        if code is not None and "training" in _code_names(code):
            return type(m).__name__
    return None


def _at_default(value, default):
    if value is default:
        return True
    simple = (bool, int, float, str, type(None))
    return isinstance(value, simple) and type(value) is type(default) and value == default


def _positional(module, args, kwargs, n):
    """The call as the first `n` positional parameters (what the harness passed), or (None, why) where another
    parameter is not at its default; (None, None) for a call the original itself refuses."""
    sig = inspect.signature(Original.forward)
    try:
        bound = sig.bind(module, *args, **kwargs)
    except TypeError:
        return None, None
    bound.apply_defaults()
    given = []
    for p in list(sig.parameters.values())[1:]:
        value = bound.arguments.get(p.name, p.default)
        if p.kind is p.VAR_POSITIONAL:
            given += [(p.name, v, inspect.Parameter.empty) for v in value]
        elif p.kind is p.VAR_KEYWORD:
            given += [(k, v, inspect.Parameter.empty) for k, v in value.items()]
        else:
            given.append((p.name, value, p.default))
    for name, value, default in given[n:]:
        if not _at_default(value, default):
            return None, f"argument {name!r} is not at its default (the kernel was verified without it)"
    if len(given) < n:
        return None, None
    return [v for _, v, _ in given[:n]], None


def _device(items):
    return next((t.device for t in items if isinstance(t, torch.Tensor)), None) or torch.device(BACKEND)


def _fallback(module, args, kwargs, key, text, warn=True):
    if STRICT:
        raise RuntimeError(f"fusebot drop-in {TARGET}: {text}")
    _note(key, text + "; the original forward runs", warn)
    return Original.forward(module, *args, **kwargs)


def _eager(module, args, kwargs):
    """An eager call: the kernel through ctypes where the guard lets it, else the original forward."""
    if not module.fusebot_enabled or _env_off(type(module).__name__):
        return Original.forward(module, *args, **kwargs)
    if torch._C._is_tracing() or _transformed() or any(isinstance(a, _PROXY) for a in (*args, *kwargs.values())):
        return _fallback(module, args, kwargs, "trace", "traced (jit.trace, fx) or under a torch.func transform such "
                         "as vmap", warn=False)
    table = _verified()[0]
    call = args
    n = len(table[0][0]) if table else len(args)
    if kwargs or len(args) != n:
        call, why = _positional(module, args, kwargs, n)
        if call is None:
            if why is None:
                return Original.forward(module, *args, **kwargs)  # the original's own error
            return _fallback(module, args, kwargs, "args", why)
    state = _state(module)
    items = [*call, *state]
    grad = torch.is_grad_enabled()
    key = []  # what the plan depends on, built in the same pass as the per-call checks
    for t in items:
        if isinstance(t, torch.Tensor):
            if grad and t.requires_grad:
                return _fallback(module, args, kwargs, "grad", "autograd wants gradients here (the kernel is for "
                                 "inference)", warn=False)
            if type(t) not in _PLAIN:
                return _fallback(module, args, kwargs, "subclass", f"a tensor subclass ({type(t).__name__})")
            layout = t.layout
            key.append((t.dtype, t.shape, t.stride() if layout == torch.strided else None, t.device, layout))
        else:
            key.append(type(t))
    key = tuple(key)
    if module.training:
        what = _train_dependent(module)
        if what:
            return _fallback(module, args, kwargs, "training", f"the module is in training mode and {what} behaves "
                             "differently there (the kernel was verified in eval mode)")
    plans = module.__dict__.get("_fusebot_plans")
    if plans is None:
        plans = module.__dict__["_fusebot_plans"] = {}
    plan = plans.get(key)
    if plan is None:
        if len(plans) > 256:
            plans.clear()
        plan = _plan(module, items, len(state))
        plan = plans[key] = (*plan, None) if plan[0] == "kernel" else plan  # its _Call made at its first kernel call
    if plan[0] == "original":
        return _fallback(module, args, kwargs, plan[1], plan[2])
    _, specs, single, exact, prepared = plan
    inputs = [(a if a.is_contiguous() else a.contiguous()) if isinstance(a, torch.Tensor)
              else torch.tensor(a, dtype=_NUMBERS[type(a).__name__][1], device=_device(items)) for a in items]
    try:
        if prepared is None:  # the first kernel call of this signature: its kernel path made once
            prepared = _Call(inputs, specs)
            plans[key] = (*plan[:4], prepared)
        outs = _run(inputs, specs, prepared)
    except BuildError as exc:
        return _fallback(module, args, kwargs, "library", str(exc))
    except KernelError as exc:
        if exact or STRICT:
            raise
        plans[key] = ("original", "kernel", f"the kernel refused a size it was not verified on ({exc})")
        return _fallback(module, args, kwargs, "kernel", plans[key][2])
    return outs[0] if single else tuple(outs)


@torch.compiler.assume_constant_result
def _compile_info(cls_name):
    """What a compiled call checks, fixed when torch.compile traces: (off, verified sets as dtype codes, sizes as
    (ABI input, element count) pairs), all constants (torch.compile guards on none of them)."""
    table = _verified()[0]
    codes = None if table is None else tuple(
        (tuple((v[0], v[1]) if v[0] == "number" else (v[0], _DTYPES.get(v[1], -1), v[2]) for v in args),
         tuple((_DTYPES.get(d, -1), s) for d, s in state)) for args, state in table)
    sizes = _sizes()
    return _env_off(cls_name), codes, None if sizes is None else tuple(sorted(sizes.items()))


def _fits_traced(items, codes, sizes):
    """The guard on traced (fake) tensors, in operations torch.compile follows."""
    for vargs, vstate in codes or ():
        want = [*vargs, *[("tensor", d, s) for d, s in vstate]]
        if len(want) != len(items):
            continue
        ok, exact = True, True
        for a, v in zip(items, want):
            if v[0] == "number":
                ok = ok and not isinstance(a, torch.Tensor) and type(a) is _NUMBERS[v[1]][0]
            elif not isinstance(a, torch.Tensor) or v[1] not in _CODES:
                ok = False
            else:
                ok = (ok and a.dtype == _CODES[v[1]] and a.device.type == BACKEND and a.layout == torch.strided
                      and a.dim() == len(v[2]))
                exact = exact and tuple(a.shape) == v[2]
        if ok and not exact:
            seen = {}
            for pos, a in enumerate(items):
                if isinstance(a, torch.Tensor):
                    rule = next((r for p, r in sizes if p == pos), None) if sizes is not None else None
                    ok = ok and sizes is not None and a.numel() > 0 and (
                        rule is None or _size_miss(tuple(a.shape), rule, seen) is None)
        if ok:
            return True
    return False


def _traced(module, args, kwargs):
    """A call torch.compile traces: the custom op where the guard lets it, else the original forward."""
    out = Original.forward(module, *args, **kwargs)  # its output layout (unused by the graph when the op runs)
    off, codes, sizes = _compile_info(type(module).__name__)
    if kwargs or off or not module.fusebot_enabled:
        return out
    state = _state(module)
    items = [*args, *state]
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in items):
        return out
    outs = [out] if isinstance(out, torch.Tensor) else list(out) if isinstance(out, (tuple, list)) else None
    if outs is None or not _fits_traced(items, codes, sizes) or not all(
            isinstance(o, torch.Tensor) and o.dtype in _DTYPES for o in outs):
        return out
    device = next(t.device for t in items if isinstance(t, torch.Tensor))
    meta = []
    for o in outs:
        meta += [_DTYPES[o.dtype], o.dim(), *o.shape, *o.stride()]
    tensors = [a if isinstance(a, torch.Tensor) else torch.tensor(a, dtype=_NUMBERS[type(a).__name__][1],
                                                                  device=device) for a in args]
    res = fused(tensors, list(state), meta)
    return res[0] if isinstance(out, torch.Tensor) else tuple(res)
