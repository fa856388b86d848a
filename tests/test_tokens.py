"""The shared token as the HTTP API takes it: the bearer scheme in any case (RFC 7235), and no token
too short to be a secret."""

import pytest

from sidecar.common import auth

TOKEN = "a-token-of-24-characters"


@pytest.mark.parametrize("header", [f"Bearer {TOKEN}", f"bearer {TOKEN}", f"BEARER {TOKEN}", f"BeArEr  {TOKEN} ",
                                    f" Bearer\t{TOKEN}"])
def test_the_bearer_scheme_is_case_insensitive(header):
    assert auth.bearer_matches(header, TOKEN)


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer ", f"Bearer{TOKEN}", f"Basic {TOKEN}",
                                    f"Bearer {TOKEN}x", f"Bearer x{TOKEN}", f"Bearer {TOKEN} {TOKEN}",
                                    f"Token {TOKEN}", f"Bearer \u00e9{TOKEN}"])
def test_anything_else_is_refused(header):
    assert not auth.bearer_matches(header, TOKEN)


@pytest.mark.parametrize("token", ["", "a", "x" * (auth.MIN_TOKEN_CHARS - 1), "sixteen chars ok",
                                   "tab\tin-a-token-0123", "caf\u00e9-0123456789abcdef", "ctrl\x01-0123456789abcdef"])
def test_a_short_or_unsendable_token_is_refused_with_a_reason(token):
    problem = auth.token_problem(token)
    assert problem is not None
    assert f"at least {auth.MIN_TOKEN_CHARS} characters" in problem or "visible ASCII" in problem


@pytest.mark.parametrize("token", ["x" * auth.MIN_TOKEN_CHARS, TOKEN, "Zm9vYmFyYmF6cXV4cXV1eA==",
                                   "a.b-c_d~e+f/g!h@i#j$"])
def test_a_long_enough_visible_ascii_token_is_taken(token):
    assert auth.token_problem(token) is None


def test_a_short_token_left_in_the_token_file_is_not_reused(tmp_path):
    path = tmp_path / "token"
    path.write_text("short\n")
    with pytest.raises(ValueError) as info:
        auth.ensure_token_file(path, None)
    assert str(path) in str(info.value) and str(auth.MIN_TOKEN_CHARS) in str(info.value)
    assert path.read_text() == "short\n"  # left for the user to see, never silently replaced


def test_a_new_token_file_holds_a_long_random_token(tmp_path):
    token = auth.ensure_token_file(tmp_path / "dir" / "token", None)
    assert auth.token_problem(token) is None
    assert auth.ensure_token_file(tmp_path / "dir" / "token", None) == token
    assert (tmp_path / "dir" / "token").stat().st_mode & 0o777 == 0o600
