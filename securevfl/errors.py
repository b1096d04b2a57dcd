"""Error types. A :class:`UserError` is a mistake the user can fix; the CLI prints it as one
``error: ...`` line and exits with status 2. Anything else is a bug (exit 1)."""


class UserError(Exception):
    """Bad flag, bad config value, missing or malformed data, unknown name, incompatible options."""


class ProtocolError(RuntimeError):
    """A party waited for a message that was never sent: a bug in a method's protocol script."""


class TrainingDiverged(UserError):
    """The loss became NaN or infinite: a configuration that cannot train (e.g. a defense too strong
    for the learning rate). A user-fixable outcome, not a bug."""
