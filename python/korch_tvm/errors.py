"""The one exception users see: its message is a single line saying what is wrong and what to do."""


class KorchError(Exception):
    """Bad input or an unusable configuration; the CLI prints it as one line and exits non-zero."""


def error_summary(text: str, limit: int = 300) -> str:
    """The line of a (TVM/C++) error text that says what went wrong.

    TVM's messages end in a traceback or context block; the last line naming an error is the
    informative one, so that is what users and logs get.
    """
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    useful = [line for line in lines if "rror" in line] or lines
    return (useful[-1] if useful else "unknown error")[:limit]
