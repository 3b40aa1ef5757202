"""A later gate's libraries imported on a thread while the first gate runs.

Why: gate 2's reference is torch and transformers, about 1 GB of shared libraries and a few thousand Python
modules. From a cold page cache (a fresh pod, or a node whose cache the model's files just filled) importing
them took 8.7 s of gate 2's 79 s on the half-7B benchmark, with both cores idle meanwhile, while gate 1 before
it waits on its reads. Imported beside gate 1 they are in `sys.modules` when gate 2 asks for them.

Nothing is decided here: a library that fails to import is left for the gate that needs it to import again and
report (a missing torch is gate 2's `ReferenceMissingError`, as before).
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Sequence


def import_on_a_thread(modules: Sequence[str]) -> threading.Thread | None:
    """Import `modules` in order on a daemon thread (None when there are none). Join it before anything else
    imports them: Python's module locks serialise two imports of one module, but transformers' lazy module
    does not, and `from transformers import AutoModel` beside this thread's import of it failed with an
    ImportError (CI: gate 2 reported transformers missing)."""
    if not modules:
        return None

    def load() -> None:
        for name in modules:
            with contextlib.suppress(Exception):  # the gate that needs it imports it again and says why
                importlib.import_module(name)

    thread = threading.Thread(target=load, name="convgate-warm-imports", daemon=True)
    thread.start()
    return thread
