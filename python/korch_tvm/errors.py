"""The one exception users see: its message is a single line saying what is wrong and what to do."""


class KorchError(Exception):
    """Bad input or an unusable configuration; the CLI prints it as one line and exits non-zero."""
