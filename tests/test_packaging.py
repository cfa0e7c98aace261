"""Installing rnngrad the README's way: ``pip install .`` and a first run (which compiles the
numba kernels), then ``pip install -e .`` over it. A kernel cache written inside the installed
package outlived the uninstall of that copy and made the ``rnngrad`` command of the editable
install fail with ``cannot import name '__version__' from 'rnngrad' (unknown location)``."""

import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytest.importorskip("numba")

REPO = Path(__file__).resolve().parent.parent
COMPILE_ONE = ("import numpy as np; from rnngrad.backends.numba import activations as a; "
               "a.activate(a.TANH, np.zeros(3), np.empty(3))")
#: the installed package's kernel folder, then "ok" if it holds every file the library source joins
#: and the source declares every entry point
SHIPPED_KERNELS = ("from rnngrad.backends.metal import library, versions; "
                   "print(library.kernel_dir()); "
                   "assert set(library.signatures(library.source())) "
                   "== set(versions.entry_points()); "
                   "print('ok')")


def _run(cmd, **kwargs):
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600,
                          **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture
def venv(tmp_path):
    """A new virtual environment that also sees this one's packages (numpy, numba), through a
    path line, not as a site directory: this environment's own rnngrad install stays out."""
    path = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", path])
    python = path / "bin" / "python"
    purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip())
    ours = [p for p in site.getsitepackages() + [sysconfig.get_paths()["purelib"]] if Path(p).is_dir()]
    (purelib / "borrowed.pth").write_text("\n".join(dict.fromkeys(ours)) + "\n")
    return python, purelib


def test_editable_install_over_a_used_regular_install_keeps_the_command_working(tmp_path, venv):
    python, purelib = venv
    src = tmp_path / "src"  # the sources as a fresh clone has them, so the checkout gets no build files
    listing = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    if listing.returncode != 0:
        pytest.skip(f"the sources are not a git checkout: {listing.stderr.strip()}")
    files = listing.stdout.split()
    for name in files:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(PATH=f"{python.parent}{os.pathsep}{env.get('PATH', '')}",
               NUMBA_CACHE_DIR="", PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_CACHE_DIR=env.get("PIP_CACHE_DIR") or os.path.join(
                   env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pip"),
               XDG_CACHE_HOME=str(tmp_path / "cache"))  # rnngrad's kernels compile anew
    pip = [python, "-m", "pip", "install", "-q", "--no-deps"]

    _run(pip + [src], env=env, cwd=tmp_path)
    _run([python, "-c", COMPILE_ONE], env=env, cwd=tmp_path)
    shipped = _run([python, "-c", SHIPPED_KERNELS], env=env, cwd=tmp_path).splitlines()
    assert Path(shipped[0]).resolve() == (purelib / "rnngrad" / "_kernels").resolve(), shipped
    assert shipped[1:] == ["ok"], shipped  # every header and kernel file, in one library source
    left = [p for p in (purelib / "rnngrad").rglob("*") if p.suffix in (".nbi", ".nbc")]
    assert left == [], f"kernel cache inside the installed package: {left}"

    _run(pip + ["-e", src], env=env, cwd=tmp_path)
    out = _run([python.parent / "rnngrad", "--version"], env=env, cwd=tmp_path)
    assert out.startswith("rnngrad ")
    where = _run([python, "-c", "import rnngrad; print(rnngrad.__file__)"], env=env, cwd=tmp_path)
    assert Path(where.strip()) == src / "rnngrad" / "__init__.py"
