"""A value computed once and kept on disk as JSON, for the next process that asks with the same key.

    value = stored(path, Model, compute, keep=lambda v: True)

The file holds a pydantic model. One that is missing or unreadable is computed again; what `compute` returns is
written whole or not at all (a temporary file replaced into place: two processes may finish together), and only
where `keep` says so (a failed capture is not kept).
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)


def stored(path: Path, model: type[M], compute: Callable[[], M], keep: Callable[[M], bool] = lambda _: True,
           what: str = "value") -> M:
    """The `model` stored at `path`, else `compute()`'s, stored there where `keep` allows."""
    try:
        found = model.model_validate_json(path.read_text())
        log.info("the %s from the cache (%s): not computed again", what, path.name)
        return found
    except (OSError, ValueError):
        pass
    value = compute()
    if keep(value):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-")
        with os.fdopen(fd, "w") as f:
            f.write(value.model_dump_json())
        os.replace(tmp, path)
    return value
