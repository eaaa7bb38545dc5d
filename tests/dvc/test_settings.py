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


def test_the_extra_is_turned_on_only_for_data_inside_a_dvc_project(tmp_path):
    from train.dvc import settings as section

    images = tmp_path / "project" / "images"
    images.mkdir(parents=True)
    s = tiny_settings(tmp_path, dataset=f"images:{images}")
    assert section.turned_on(s) == ""  # a run on other data runs none of the extra
    (tmp_path / "project" / ".dvc").mkdir()
    assert section.turned_on(s) == "DVC_COMMAND"
