"""The exceptions users see: each message is a single line saying what is wrong and what to do.

Two kinds, because the fix lies in different places: `KorchError` is the user's input (a model,
a flag, a log: exit 2), `EnvironmentFault` is the machine (disk full, permissions, memory:
exit 1). Anything else that escapes is a bug of ours (exit 3).
"""


class KorchError(Exception):
    """Bad input or an unusable configuration; the CLI prints it as one line and exits 2."""


class EnvironmentFault(KorchError):
    """The machine refused: no space, no permission, not enough memory. The CLI exits 1.

    A subclass of `KorchError` so that code catching input errors also catches these; the CLI
    checks for it first.
    """


def error_summary(text: str, limit: int = 300) -> str:
    """The line of a (TVM/C++) error text that says what went wrong.

    TVM's messages end in a traceback or context block; the last line naming an error is the
    informative one, so that is what users and logs get.
    """
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    useful = [line for line in lines if "rror" in line] or lines
    return (useful[-1] if useful else "unknown error")[:limit]
