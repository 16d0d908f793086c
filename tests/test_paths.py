"""Outputs go where the learner is: figures/, runs/ and the data cache follow one helper."""

from pathlib import Path

import pytest

import diloco_lite
from diloco_lite import data, paths, plots, reproduce

PACKAGE = Path(diloco_lite.__file__).resolve().parent


@pytest.fixture
def clean_env(monkeypatch):
    for name in (paths.HOME_ENV, "DILOCO_LITE_RUNS_DIR", "DILOCO_LITE_DATA_DIR",
                 "DILOCO_LITE_QUICK"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _every_output_dir() -> list[Path]:
    return [plots.FIGURES_DIR, plots.default_figures_dir(), reproduce.runs_dir(False),
            data.cache_dirs()[0]]


def test_outside_a_clone_everything_goes_under_the_working_directory(tmp_path, clean_env):
    """Colab: a non-editable install must not write into site-packages."""
    clean_env.chdir(tmp_path)
    assert paths.project_root() == tmp_path.resolve()
    assert _every_output_dir() == [tmp_path / "figures", tmp_path / "figures",
                                   tmp_path / "runs", tmp_path / "data" / "cache"]
    assert not any(PACKAGE in d.parents for d in _every_output_dir())


def test_inside_a_clone_the_clone_root_is_found_from_a_subfolder(tmp_path, clean_env):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "diloco_lite"\n')
    (tmp_path / "notebooks" / "exercises").mkdir(parents=True)
    clean_env.chdir(tmp_path / "notebooks" / "exercises")
    assert paths.project_root() == tmp_path.resolve()
    assert plots.FIGURES_DIR == tmp_path / "figures"
    assert reproduce.runs_dir(True) == tmp_path / "runs" / "quick"


def test_another_projects_pyproject_is_not_ours(tmp_path, clean_env):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "something_else"\n')
    (tmp_path / "sub").mkdir()
    clean_env.chdir(tmp_path / "sub")
    assert paths.project_root() == (tmp_path / "sub").resolve()


def test_the_home_variable_wins_and_finer_variables_win_over_it(tmp_path, clean_env):
    clean_env.chdir(tmp_path)
    clean_env.setenv(paths.HOME_ENV, str(tmp_path / "home"))
    assert _every_output_dir()[0] == tmp_path / "home" / "figures"
    assert data.cache_dirs()[0] == tmp_path / "home" / "data" / "cache"
    clean_env.setenv("DILOCO_LITE_RUNS_DIR", str(tmp_path / "r"))
    clean_env.setenv("DILOCO_LITE_DATA_DIR", str(tmp_path / "d"))
    assert reproduce.runs_dir(False) == tmp_path / "r"
    assert data.cache_dirs()[0] == tmp_path / "d"


def test_quick_figures_never_land_on_the_committed_ones(tmp_path, clean_env):
    clean_env.chdir(tmp_path)
    clean_env.setenv("DILOCO_LITE_QUICK", "1")
    assert plots.default_figures_dir() == paths.figures_dir(quick=True) == (
        tmp_path / "figures" / "quick")
