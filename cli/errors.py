"""Exit codes and the one-line rendering of problem documents (application/problem+json).

Exit codes are stable, for scripts: 0 ok, 1 failed, 2 usage, 3 not found, 4 denied (401/403),
5 conflict (409). A 400/422 is the caller's input refused by the server: a usage error (2). 429 and 5xx: 1."""
from __future__ import annotations

OK, FAILED, USAGE, NOT_FOUND, DENIED, CONFLICT = 0, 1, 2, 3, 4, 5
INTERRUPTED = 130

_BY_STATUS = {400: USAGE, 422: USAGE, 401: DENIED, 403: DENIED, 404: NOT_FOUND, 405: NOT_FOUND, 409: CONFLICT}


class CliError(Exception):
    """Ends the command: ``message`` on stderr (prefixed ``error: ``), exit with ``code``."""

    def __init__(self, message: str, code: int = FAILED):
        super().__init__(message)
        self.message, self.code = message, code


class ApiError(CliError):
    """An HTTP answer other than the expected one; ``problem`` is the decoded body (a problem document, or
    whatever the server sent)."""

    def __init__(self, status: int, problem: object):
        super().__init__(problem_line(status, problem), exit_code(status))
        self.status, self.problem = status, problem


def exit_code(status: int) -> int:
    """The exit code for an HTTP status that is an error."""
    return _BY_STATUS.get(status, FAILED)


def problem_line(status: int, problem: object) -> str:
    """``<title>: <detail> (HTTP <status>)``, then ``; <field>: <message>`` for each field error. A body that is
    not a problem document is shown as text, cut to one line."""
    if not isinstance(problem, dict):
        text = " ".join(str(problem or "").split())[:300]
        return f"{text or 'no detail'} (HTTP {status})"
    title = str(problem.get("title") or "error")
    detail = problem.get("detail")
    line = f"{title}: {detail}" if detail and detail != title else title
    line = " ".join(line.split())
    fields = [f"{e.get('field') or '?'}: {e.get('message') or e.get('code') or 'invalid'}"
              for e in problem.get("errors") or [] if isinstance(e, dict)]
    return f"{line} (HTTP {status})" + "".join(f"; {f}" for f in fields)
