"""Errors the CLI turns into one line on stderr and exit code 2, never a traceback."""


class NativeLoopsError(Exception):
    """A problem the user can fix; the message names it and the fix."""


class HarDataError(NativeLoopsError):
    """The input data cannot give a HAR data set (missing columns, bad values, empty split...)."""
