"""Error types. A :class:`UserError` is a mistake the user can fix; the CLI prints it as one
``error: ...`` line and exits with status 2. Anything else is a bug (exit 1)."""


class UserError(Exception):
    """Bad flag, bad config value, missing or malformed data, unknown name, incompatible options."""


class ProtocolError(RuntimeError):
    """A party waited for a message that was never sent: a bug in a method's protocol script."""


class TrainingDiverged(UserError):
    """The loss became NaN or infinite: a configuration that cannot train (e.g. a defense too strong
    for the learning rate). A user-fixable outcome, not a bug."""


def os_cause(e: OSError) -> str:
    """An OSError's cause in words ("No space left on device", "File too large", "Permission denied")."""
    return e.strerror or str(e) or type(e).__name__


def environment_error(e: OSError | MemoryError) -> UserError:
    """A failure of this machine (a full disk, a file-size limit, a folder it cannot write, memory), as
    one line naming the file and the cause: the CLI and a serving party report it like a user's
    mistake (exit 2, the peer told why), never as a traceback."""
    if isinstance(e, MemoryError):
        return UserError("out of memory (a line, a cell or an array larger than this machine's free memory; "
                         "SECUREVFL_MAX_LINE_BYTES caps a line of a party file)")
    where = f"{e.filename}: " if e.filename else ""
    return UserError(f"{where}{os_cause(e)} (the machine's limits: free space, a file-size limit, permissions)")
