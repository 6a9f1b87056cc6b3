"""What a command sees of its grant: a fixed, documented environment, never the server's own.

Every backend gives a command exactly these variables (and nothing of the server's environment,
which may hold its bearer token):

    PATH                              a fixed system PATH (`SAFE_PATH`)
    HOME                              the environment's work directory
    LANG                              C.UTF-8
    TANGRAM_ENV_ID                    the environment's id
    TANGRAM_CPUS                      the number of granted cores (the cpuset makes `nproc` and
                                      `os.sched_getaffinity` agree)
    OMP_NUM_THREADS, MKL_NUM_THREADS,
    OPENBLAS_NUM_THREADS              the granted cores, so numeric libraries size their pools
    PYTEST_XDIST_AUTO_NUM_WORKERS     the granted cores, what `pytest -n auto` uses
    TANGRAM_PYTHON                    the server's own Python as the command runs it (its
                                      `sys.executable` on the host; in a bwrap sandbox, a
                                      place under /opt/tangram, `bwrap.views`), where the
                                      command can run it (not in a container, not in an
                                      image's root)

An exec granted GPUs (a vector exec: `tg.exec(..., gpus=k)`) also gets

    TANGRAM_GPUS                      the granted GPUs, the host's indices ("2,3")
    CUDA_VISIBLE_DEVICES              those GPUs as CUDA numbers them in the command's view:
                                      the host's indices where every GPU stays visible
                                      (cgroup, affinity: no device isolation), "0,1" where
                                      only the granted device nodes are there (bwrap: the
                                      driver numbers the devices it can open from 0)
    CUDA_DEVICE_ORDER                 PCI_BUS_ID, so CUDA's order is the host's (NVML's)

An elastic exec also gets `PYTEST_PLUGINS=tangram_pytest_grant` and `PYTHONPATH` naming the
folder that holds it: a pytest plugin that adds `-n <granted cores>` only where pytest-xdist is
importable and the command did not choose its own `-n`, and does nothing otherwise. The command
text itself is never rewritten. (A command that replaces PYTHONPATH should keep the plugin's
folder on it, else pytest cannot load the plugin it was told to.)
"""

from __future__ import annotations

import shutil
from pathlib import Path

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PLUGIN = "tangram_pytest_grant"
PLUGIN_SOURCE = Path(__file__).with_name("pytest_grant") / f"{PLUGIN}.py"
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "PYTEST_XDIST_AUTO_NUM_WORKERS",
)


GPU_VARIABLES = ("TANGRAM_GPUS", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


def command_env(
    env_id: str,
    cores: int,
    home: str,
    *,
    elastic: bool,
    plugin_dir: str,
    gpus: tuple[int, ...] = (),
    gpus_isolated: bool = False,
    python: str | None = None,
) -> dict[str, str]:
    """The whole environment of one command (see the module docstring); `gpus`: the host
    indices of its granted GPUs, `gpus_isolated`: only their device nodes are visible;
    `python`: the server's own Python as the command runs it (`TANGRAM_PYTHON`)."""
    n = str(cores)
    variables = {
        "PATH": SAFE_PATH,
        "HOME": home,
        "LANG": "C.UTF-8",
        "TANGRAM_ENV_ID": env_id,
        "TANGRAM_CPUS": n,
        **dict.fromkeys(THREAD_VARIABLES, n),
    }
    if python is not None:
        variables["TANGRAM_PYTHON"] = python
    if gpus:
        visible = range(len(gpus)) if gpus_isolated else gpus
        variables["TANGRAM_GPUS"] = ",".join(map(str, gpus))
        variables["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, visible))
        variables["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if elastic:
        variables["PYTEST_PLUGINS"] = PLUGIN
        variables["PYTHONPATH"] = plugin_dir
    return variables


def install_plugin(folder: Path) -> Path:
    """Copy the pytest plugin into `folder` (created world-readable, so a sandbox's own user
    can read it where the package itself is not readable); returns the folder."""
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    folder.chmod(0o755)
    target = folder / PLUGIN_SOURCE.name
    shutil.copyfile(PLUGIN_SOURCE, target)
    target.chmod(0o644)
    return folder
