"""What every thin entry point in launch/ shares: a user error is one line on stderr, never a traceback."""
from __future__ import annotations

import sys


def fail(err: Exception, code: int = 2, exit=sys.exit) -> None:
    """A user error (exit code 2) or a stop with a reason (1): one line on stderr, no traceback."""
    print(f"error: {one_line(err)}", file=sys.stderr, flush=True)
    exit(code)


def one_line(err) -> str:
    """An error's text on one line: a message that quotes another library's (torch's, a parser's) may carry its line
    breaks and blank lines; they become single spaces, so that every entry point's refusal stays one line whatever
    it quotes."""
    return " ".join(line.strip() for line in str(err).splitlines() if line.strip())
