"""User-facing errors of xtrain.

Every error a user can cause (a bad config, a bad checkpoint folder, an unavailable attention backend) is a
``ValueError`` subclass whose message names the problem (file, key, field) and how to fix it, so command-line
entry points can print one line instead of a traceback.
"""


class XtrainError(ValueError):
    """Base class of the errors a user can cause and fix."""


class ConfigError(XtrainError):
    """A model or run configuration that xtrain cannot honour (unknown field, unsupported feature)."""


class CheckpointError(XtrainError):
    """A Hugging Face checkpoint folder that cannot be read or written: the message names the file and key."""


class AttentionBackendError(XtrainError):
    """An attention backend was requested explicitly but cannot run here."""


class DataError(XtrainError):
    """Training data that cannot be used: a missing source, a source with no valid line, a bad tokenizer folder.

    The message names the file (and the line when one line is at fault).
    """


class TrainingStoppedError(RuntimeError):
    """Training cannot go on (e.g. too many steps in a row with a non-finite loss); the message says why."""
