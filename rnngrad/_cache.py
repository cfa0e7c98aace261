"""rnngrad's per-user cache folder, where compiled code is kept between processes: the numba
backend's kernels (``numba/``) and the Metal emulator's shared libraries (``metal-emulator/``).

Compiled code is loaded from here (numba's cache files are pickles), so every folder is created
with mode 0700 and one that another user owns or could write to is refused. Nothing is ever
written inside the installed package: uninstalling rnngrad leaves nothing behind in
site-packages.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class UnsafeCacheError(PermissionError):
    """A cache folder that another user owns or could write to."""


def user_cache_dir(name: str) -> Path:
    """``$XDG_CACHE_HOME/rnngrad/<name>`` (default ``~/.cache``), created 0700 if missing.

    Raises :class:`UnsafeCacheError` when it or ``rnngrad/`` is owned by another user or
    writable by group or others."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"))
    path = base / "rnngrad" / name
    base.mkdir(parents=True, exist_ok=True)
    for folder in (path.parent, path):
        folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.stat()
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UnsafeCacheError(
                f"refusing to load compiled kernels from {folder}: expected a directory owned by "
                f"uid {os.getuid()} and writable only by it, got owner {info.st_uid}, mode "
                f"{stat.filemode(info.st_mode)}. Fix it with `chmod 700 {folder}` or set "
                "XDG_CACHE_HOME.")
    return path
