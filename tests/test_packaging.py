"""Packaging: environment.yml pins what pyproject.toml pins; the build warns of nothing deprecated;
importing starts no backend."""

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib
import yaml  # noqa: F401  (pyyaml comes with jupytext)

ROOT = Path(__file__).resolve().parents[1]


def _pins(lines):
    out = {}
    for line in lines:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)\s*(==|=)\s*([^\s#]+)\s*", line)
        if m:
            out[m[1].lower().replace("_", "-")] = m[3]
    return out


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + [d for extra in project["optional-dependencies"].values()
                                          for d in extra]
    py = _pins(declared)
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda_lines = [d for d in env["dependencies"] if isinstance(d, str)]
    pip_lines = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    conda = {k: v for k, v in _pins(conda_lines).items() if k not in ("python",)}
    yml = {**conda, **_pins(pip_lines)}
    assert py == yml
    assert len(py) >= 15


def test_the_build_warns_of_nothing_deprecated(tmp_path):
    """The sdist and wheel build as pip builds them (PEP 517 hooks), with no deprecation warning
    (e.g. `project.license as a TOML table is deprecated`), and the license as SPDX metadata."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement

    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
    wanted = next(Requirement(r) for r in build["requires"] if r.startswith("setuptools"))
    assert not wanted.specifier.contains("76.1.0"), "the SPDX license string needs setuptools>=77"
    try:
        have = version("setuptools")
    except PackageNotFoundError:
        have = None
    if have is None or not wanted.specifier.contains(have):
        pytest.skip(f"setuptools {have} here, the build needs {wanted} (the [dev] extra pins it; "
                    "the Colab lane's stack doesn't)")
    src = tmp_path / "src"  # a copy: the build writes build/ and *.egg-info next to its sources
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "setup.py", "setup.cfg", "MANIFEST.in"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "diloco_lite", src / "diloco_lite",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path / "dist"
    hooks = ("import sys, setuptools.build_meta as b; out = sys.argv[1];"  # the hooks edit argv
             "print(b.build_sdist(out)); print(b.build_wheel(out))")
    run = subprocess.run([sys.executable, "-W", "always", "-c", hooks, str(out)], cwd=src,
                         capture_output=True, text=True, timeout=120)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log
    warned = [line for line in log.splitlines() if re.search(r"deprecat", line, re.IGNORECASE)]
    assert not warned, "the build warns:\n" + "\n".join(warned) + "\n\nfull output:\n" + log
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA")))
    assert "License-Expression: MIT" in metadata.decode().splitlines()


def test_import_does_not_start_a_backend():
    """After importing every public module, the device count can still be chosen."""
    code = ("import diloco_lite as dl, diloco_lite.config, diloco_lite.devices, jax;"
            "import diloco_lite.reference, diloco_lite.exercises, diloco_lite.wire;"
            "[getattr(dl, name) for name in dl.__all__];"
            "jax.config.update('jax_num_cpu_devices', 3); print(len(jax.devices()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PATH": "", "JAX_PLATFORMS": "cpu"})
    assert out.stdout.strip() == "3"


def test_emulate_devices_too_late_is_a_clear_error():
    code = ("import jax; jax.devices();"
            "import diloco_lite as dl\n"
            "try:\n    dl.emulate_devices(4)\nexcept RuntimeError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PATH": "", "JAX_PLATFORMS": "cpu"})
    assert "Restart the kernel" in out.stdout and "emulate_devices(4)" in out.stdout


def test_emulate_devices_raises_the_collective_timeouts_unless_set():
    code = ("import os, diloco_lite as dl; dl.emulate_devices(2); import jax; jax.devices();"
            "print(os.environ.get('XLA_FLAGS', ''))")
    run = lambda env: subprocess.run([sys.executable, "-c", code], capture_output=True,  # noqa
                                     text=True, check=True, env={"PATH": "", **env}).stdout
    flags = run({"JAX_PLATFORMS": "cpu"})
    if not _jaxlib_has_the_timeout_flags():  # an older XLA would abort on the unknown flags
        assert "collective_call" not in flags
        return
    for name, seconds in dl_devices().COLLECTIVE_TIMEOUTS.items():
        assert f"--{name}={seconds}" in flags
    mine = "--xla_cpu_collective_call_terminate_timeout_seconds=7"
    flags = run({"JAX_PLATFORMS": "cpu", "XLA_FLAGS": mine})
    assert mine in flags and "terminate_timeout_seconds=1800" not in flags
    assert "warn_stuck_timeout_seconds=120" in flags
    # single-threaded ops with more than one device, not with one
    assert "--xla_cpu_multi_thread_eigen=false" in flags
    one = run({"JAX_PLATFORMS": "cpu", "DILOCO_LITE_DEVICES": "1"})
    assert "multi_thread_eigen" not in one


def test_single_threaded_ops_whatever_the_core_count(monkeypatch):
    # multi-threaded ops round vmapped workers differently: a 16-core machine must set the same
    # flag as this project's 2 cores for 2 (and 8) devices, and leave one device its threads
    import os

    devices = dl_devices()
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    for n, single in ((2, True), (8, True), (1, False)):
        monkeypatch.setenv("XLA_FLAGS", "")
        devices._set_xla_flags(n)
        assert ("--xla_cpu_multi_thread_eigen=false" in os.environ["XLA_FLAGS"]) == single, n


def test_device_count_switch_overrides_the_argument():
    code = "import diloco_lite as dl; dl.emulate_devices(8); import jax; print(len(jax.devices()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PATH": "", "JAX_PLATFORMS": "cpu", "DILOCO_LITE_DEVICES": "1"})
    assert out.stdout.strip() == "1"


def _jaxlib_has_the_timeout_flags() -> bool:
    import importlib.metadata

    version = importlib.metadata.version("jaxlib")
    since = dl_devices().COLLECTIVE_TIMEOUTS_SINCE
    return tuple(int(x) for x in re.findall(r"\d+", version)[:3]) >= since


def dl_devices():
    from diloco_lite import devices

    return devices


def test_emulate_devices_sets_the_count():
    code = "import diloco_lite as dl; dl.emulate_devices(3); import jax; print(len(jax.devices()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PATH": "", "JAX_PLATFORMS": "cpu"})
    assert out.stdout.strip() == "3"


def test_every_notebook_is_paired_and_committed_without_outputs():
    import jupytext

    sources = sorted(p for p in (ROOT / "notebooks").rglob("*.py")  # the exercises' too
                     if ".ipynb_checkpoints" not in p.parts)
    assert len(sources) >= 18
    for py in sources:
        ipynb = py.with_suffix(".ipynb")
        assert ipynb.exists(), f"{ipynb.name} missing: run `make notebooks-sync`"
        want = [(c.cell_type, c.source) for c in jupytext.read(py).cells]
        have = jupytext.read(ipynb)
        assert [(c.cell_type, c.source) for c in have.cells] == want, (
            f"{ipynb.name} is stale: run `make notebooks-sync`")
        assert all(not c.get("outputs") for c in have.cells if c.cell_type == "code")
        first = have.cells[0].source
        assert "colab.research.google.com" in first, f"{ipynb.name}: no Colab badge"
