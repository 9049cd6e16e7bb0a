"""``--watch-config``: reload the control plane when its config file changes, as SIGHUP does.

Why polling ``stat`` rather than inotify: Kubernetes mounts a ConfigMap as ``dlb.yaml`` →
``..data/dlb.yaml``, and an update swaps the ``..data`` symlink to a new timestamped folder in one
rename. An inotify watch on the file itself keeps watching the old folder, which is then deleted;
``os.stat`` follows the symlinks on every call, so the new file (another inode) shows at the next
poll. A poll per second costs one ``stat``, and the reload it triggers is rare.

:func:`stamp` says what identifies one version of the file; :func:`watch` calls ``on_change`` once
per new version (a file that is briefly missing mid-swap is not a change).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass

from dlb.log import get_logger

log = get_logger("dlb.control_plane.watch")


@dataclass(frozen=True)
class FileStamp:
    """One version of a file as ``stat`` sees it through every symlink."""

    target: str  # the path after symlinks: a ConfigMap update changes its ..<timestamp> folder
    device: int
    inode: int
    size: int
    mtime_ns: int


def stamp(path: str | os.PathLike[str]) -> FileStamp | None:
    """The file's current :class:`FileStamp`, or None while it does not exist."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return FileStamp(os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


async def watch(path: str | os.PathLike[str], on_change: Callable[[], None], period_s: float = 1.0) -> None:
    """Poll ``path`` every ``period_s`` and call ``on_change`` when a new version appears; runs until cancelled."""
    last = stamp(path)
    while True:
        await asyncio.sleep(period_s)
        now = stamp(path)
        if now is None or now == last:
            continue
        last = now
        log.info("config_changed", path=os.fspath(path), target=now.target)
        on_change()
