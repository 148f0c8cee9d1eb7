"""FUSEBOT_DISABLE and `adopt`, the first part of every drop-in (before it imports the module of the original class).

A module can adopt the drop-in (the edit a kernel PR makes to the marked class's file, runner/results/adoption.py):
`Cls = adopt(Cls)` at its end binds the class's name to the subclass. `adopt` is defined before the drop-in imports
that module, so either may be imported first; FUSEBOT_DISABLE then keeps the original class.
"""

import os

from runner.shipped.dropin.head import TARGET

# ---- the drop-in from here on

def _env_off(cls_name):
    """FUSEBOT_DISABLE: 1/true/all turns every drop-in off; a comma-separated list of targets or class names, these.
    Read at every call; its value's meaning worked out once per value and class."""
    value = os.environ.get("FUSEBOT_DISABLE", "")
    off = _OFF.get((value, cls_name))
    if off is None:
        off = _OFF[(value, cls_name)] = _names_off(value.strip(), cls_name)
    return off


def _names_off(value, cls_name):
    if not value or value.lower() in ("0", "false", "no"):
        return False
    names = {v.strip().lower() for v in value.split(",")}
    return bool(names & {"1", "true", "yes", "all", TARGET.lower(), cls_name.lower()})


_OFF = {}  # (FUSEBOT_DISABLE's value, class name) -> off


_ADOPTING = []  # modules that asked for this drop-in's class while it was still loading (it was importing them)


def adopt(original):
    """The class a module that adopts this drop-in binds in place of `original`, its own class: this drop-in's
    subclass, or `original` itself where FUSEBOT_DISABLE names it (read once, as the module is imported). Called
    while this drop-in is still loading (it imports that module for the original class), it answers `original` and
    binds the module's name to the subclass once loaded."""
    if _env_off(original.__name__):
        return original
    dropin = globals().get("_DROPIN")
    if dropin is None:
        _ADOPTING.append(original.__module__)
        return original
    return dropin
