"""API settings parsing (the live API path is tested in test_fix_lab.py)."""

from __future__ import annotations

import pytest

from gpudoctor.pve.api import ApiSettings, connect, split_token
from gpudoctor.pve.apply import ApplyError


def test_token_is_split_and_never_shown() -> None:
    assert split_token("root@pam!gd=abc=def") == ("root@pam", "gd", "abc=def")
    assert "abc" not in repr(ApiSettings("https://pve1", "root@pam!gd=abc"))


@pytest.mark.parametrize("bad", ["root@pam=abc", "root!gd=abc", "root@pam!gd=", "x"])
def test_malformed_tokens_are_usage_errors(bad: str) -> None:
    with pytest.raises(ApplyError, match="USER@REALM!TOKENID=SECRET") as info:
        split_token(bad)
    assert info.value.code == "usage"


def test_api_url_must_be_https() -> None:
    with pytest.raises(ApplyError, match="expected https"):
        connect(ApiSettings("http://pve1:8006", "root@pam!gd=abc"))


def test_api_needs_a_token_or_a_user_and_password() -> None:
    with pytest.raises(ApplyError, match="--api-user and --api-password") as info:
        connect(ApiSettings("https://127.0.0.1:1", user="root@pam"))
    assert info.value.code == "usage"
    assert "s3cret" not in repr(ApiSettings("https://x", user="root@pam", password="s3cret"))
