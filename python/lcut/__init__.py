"""lcut in Python: layer-wise diagnostics and SPEED for decoder-only LMs.

The package runs lcut's Rust engine in-process (no second implementation):
load a model folder or GGUF file, run prompts under a visibility policy
(``full``, ``speed:3/4+bos``, ...), get the per-layer, per-head attention
masses as numpy arrays, the recommended cutoff and its evidence, timed
generations and task-suite scores.

    >>> import lcut
    >>> s = lcut.load("models/SmolLM2-135M-Instruct.Q4_1.gguf", dtype="q")
    >>> t = s.trace("The code is 4817. Repeat the code.", max_new_tokens=8)
    >>> t.prefill_mass.shape          # [layers, heads, steps]
    >>> s.diagnose().recommended_l_cut

See ``help(lcut.load)``, ``help(lcut.Session)`` and docs/python.md.
"""

from ._errors import InvalidInputError, LcutError, NotFoundError
from ._lcut import (
    KEEPS_FREED_BUFFERS,
    LAYER_METRICS,
    Forward,
    Generation,
    ModelConfig,
    Report,
    Routing,
    Session,
    Trace,
    __version__,
    load,
)

__all__ = [
    "KEEPS_FREED_BUFFERS",
    "LAYER_METRICS",
    "Forward",
    "Generation",
    "InvalidInputError",
    "LcutError",
    "ModelConfig",
    "NotFoundError",
    "Report",
    "Routing",
    "Session",
    "Trace",
    "__version__",
    "load",
]
