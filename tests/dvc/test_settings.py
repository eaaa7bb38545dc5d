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
