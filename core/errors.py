"""The errors tileinfer raises for bad input; the CLI prints them as one line.

ConfigError and UsageError are the user's to fix on the command line (exit status 2);
CheckpointError and the rest of TileinferError are about files and state (exit status 1).
"""


class TileinferError(Exception):
    """Base of every error tileinfer reports to a user without a traceback."""

    exit_status = 1


class ConfigError(TileinferError):
    """An unknown config key, a bad value, or an implementation name nobody registered."""

    exit_status = 2


class UsageError(TileinferError):
    """Bad input to a call: an empty prompt, token ids outside the vocabulary, too long a prompt."""

    exit_status = 2


class CheckpointError(TileinferError):
    """A checkpoint folder that is missing, incomplete, corrupt or not a supported Qwen3 model."""


class PluginError(TileinferError):
    """A plugin that fails to load, or two plugins registering the same name for one interface."""


class NumericsError(TileinferError):
    """A step whose logits are not finite (NaN or inf): nothing is sampled from them."""
