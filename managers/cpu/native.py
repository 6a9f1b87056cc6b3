"""Building the sandbox's small C helpers (the seccomp loader, the spawner) with the host's
compiler, where it has one: their Python versions are used where it has none."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def build_c(folder: Path, name: str, source: str) -> bool:
    """Compile `source` into `folder/name` (mode 0755); False where there is no C compiler or
    the build fails."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return False
    path = folder / f"{name}.c"
    path.write_text(source)
    try:
        done = subprocess.run(
            [cc, "-O2", "-o", str(folder / name), str(path)], capture_output=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    if done.returncode != 0:
        return False
    (folder / name).chmod(0o755)
    return True
