"""The CLI's config file: 0600 in a 0700 directory, contexts, and which context a command runs in."""
from __future__ import annotations

import stat

import pytest

from cli import config
from cli.errors import CliError


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.delenv("TESSERA_CONFIG", raising=False)
    monkeypatch.delenv("TESSERA_URL", raising=False)
    monkeypatch.delenv("TESSERA_API_KEY", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    return tmp_path


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_saved_file_is_0600_in_a_0700_directory(home):
    path = config.save({"current": "a", "contexts": {"a": {"url": "http://x", "api_key": "k"}}})
    assert path == home / "tessera" / "config.json"
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
    assert config.load()["contexts"]["a"]["api_key"] == "k"
    assert not [p for p in path.parent.iterdir() if p.name != "config.json"]   # no temporary file left


def test_tessera_config_overrides_the_path(home, tmp_path, monkeypatch):
    target = tmp_path / "elsewhere" / "c.json"
    monkeypatch.setenv("TESSERA_CONFIG", str(target))
    assert config.save({"current": None, "contexts": {}}) == target and _mode(target) == 0o600


def test_resolve_current_named_and_environment(home, monkeypatch):
    config.save({"current": "a", "contexts": {"a": {"url": "http://a/", "api_key": "ka"},
                                              "b": {"url": "http://b", "api_key": "kb", "token": "t",
                                                    "token_expires_at": 5}}})
    assert (config.resolve(None).name, config.resolve(None).url) == ("a", "http://a")
    b = config.resolve("b")
    assert (b.api_key, b.token, b.token_expires_at) == ("kb", "t", 5.0)
    monkeypatch.setenv("TESSERA_URL", "http://env")
    monkeypatch.setenv("TESSERA_API_KEY", "ke")
    env = config.resolve(None)
    assert (env.url, env.api_key, env.saved) == ("http://env", "ke", False)
    assert config.resolve("b").name == "b"            # an explicit --context wins over the environment


def test_no_context_is_a_usage_error(home):
    with pytest.raises(CliError) as exc:
        config.resolve(None)
    assert exc.value.code == 2
    with pytest.raises(CliError):
        config.resolve("missing")


def test_a_refreshed_token_is_written_back(home):
    config.save({"current": "a", "contexts": {"a": {"url": "http://a", "api_key": "ka"}}})
    ctx = config.resolve(None)
    ctx.remember_token("tok", 123.0)
    entry = config.load()["contexts"]["a"]
    assert (entry["token"], entry["token_expires_at"]) == ("tok", 123.0)
    assert _mode(config.config_path()) == 0o600
