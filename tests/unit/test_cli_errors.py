"""Exit codes from problem documents, and the one-line rendering of a problem."""
from __future__ import annotations

import pytest

from cli.errors import ApiError, exit_code, problem_line


@pytest.mark.parametrize(("status", "code"), [(400, 2), (422, 2), (401, 4), (403, 4), (404, 3), (409, 5),
                                              (429, 1), (500, 1), (502, 1), (503, 1)])
def test_exit_code_of_each_status(status, code):
    assert exit_code(status) == code
    assert ApiError(status, {"title": "t", "status": status}).code == code


def test_problem_line_is_title_detail_and_status():
    p = {"type": "about:blank", "title": "Not Found", "status": 404, "detail": "no allocation 3f"}
    assert problem_line(404, p) == "Not Found: no allocation 3f (HTTP 404)"


def test_problem_line_lists_field_errors():
    p = {"title": "Validation failed", "status": 422, "detail": "the request is invalid",
         "errors": [{"field": "shape", "message": "unknown shape", "code": "x"}, {"field": "name", "code": "too_long"}]}
    assert problem_line(422, p) == ("Validation failed: the request is invalid (HTTP 422); shape: unknown shape; "
                                    "name: too_long")


def test_problem_line_is_one_line_even_for_text_bodies():
    assert problem_line(502, "<html>\n bad gateway\n</html>") == "<html> bad gateway </html> (HTTP 502)"
    assert "\n" not in problem_line(400, {"title": "Bad", "detail": "a\nb"})
    assert problem_line(500, None) == "no detail (HTTP 500)"
