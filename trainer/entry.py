"""What every thin entry point in launch/ shares: a user error is one line on stderr, never a traceback."""
from __future__ import annotations

import sys


def fail(err: Exception, code: int = 2, exit=sys.exit) -> None:
    """A user error (exit code 2) or a stop with a reason (1): one line on stderr, no traceback."""
    print(f"error: {err}", file=sys.stderr, flush=True)
    exit(code)
