"""train.dvc.settings: its section joins the settings; DVC_DATA_CACHE may not be empty."""

from __future__ import annotations

import pytest
from helpers import tiny_settings

from train.config import validate
from train.errors import ConfigError


def test_an_empty_data_cache_is_refused_naming_the_default(tmp_path):
    with pytest.raises(ConfigError, match=r"^DVC_DATA_CACHE='' is not valid: must not be empty \(the default is ~/"):
        validate(tiny_settings(tmp_path, dvc_data_cache=" "))
    assert tiny_settings(tmp_path).dvc_command == ""  # found by itself: .venv-dvc, then PATH


@pytest.mark.parametrize("name", ["dvc_data_cache"])
def test_a_cache_in_the_home_of_an_unknown_user_is_one_config_error(tmp_path, name):
    """~nouser/cache (a user unknown here): RuntimeError: Could not determine home directory, where it was used."""
    with pytest.raises(ConfigError) as info:
        validate(tiny_settings(tmp_path, **{name: "~nouser-x/cache"}))
    assert str(info.value) == (
        f"{name.upper()}='~nouser-x/cache' is not valid: ~nouser-x is the home folder of a user named 'nouser-x', "
        "unknown here: write ~/nouser-x/cache for a folder in your own home, or a full path"
    )


def test_the_extra_is_turned_on_only_for_data_inside_a_dvc_project(tmp_path):
    from train.dvc import settings as section

    images = tmp_path / "project" / "images"
    images.mkdir(parents=True)
    s = tiny_settings(tmp_path, dataset=f"images:{images}")
    assert section.turned_on(s) == ""  # a run on other data runs none of the extra
    (tmp_path / "project" / ".dvc").mkdir()
    assert section.turned_on(s) == "DVC_COMMAND"
