"""The exceptions lcut raises.

Every error carries lcut's own message (which file, which field, what was
expected). Catch ``lcut.LcutError`` for all of them; the two subclasses are
also the built-in exceptions a Python caller expects, so ``except ValueError``
and ``except FileNotFoundError`` work as well.
"""


class LcutError(Exception):
    """Base class of every error lcut raises."""


class InvalidInputError(LcutError, ValueError):
    """Input the caller can correct: a malformed policy string or a cutoff out
    of range, token ids outside the vocabulary, an empty or too long prompt,
    an unknown dtype or device, a layer or step out of range."""


class NotFoundError(LcutError, FileNotFoundError):
    """A model, adapter, prompt set, suite or report path that is not there."""
