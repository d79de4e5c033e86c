"""Folders under the build tree where npm packages and node scripts live, shared by tests
that ctest runs side by side: a file is replaced whole (a node starting in another test
never reads it half-written or empty), and one npm install runs at a time per folder."""
import fcntl
import os
import shutil
import subprocess


def place(src, work):
    """Copies src into the folder work under its own name, unless the same bytes are there:
    written beside it and renamed over it."""
    dst = os.path.join(work, os.path.basename(src))
    with open(src, "rb") as f:
        data = f.read()
    try:
        with open(dst, "rb") as f:
            if f.read() == data:
                return dst
    except FileNotFoundError:
        pass
    tmp = f"{dst}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    shutil.copymode(src, tmp)
    os.replace(tmp, dst)
    return dst


def npm_install(work, ready, timeout=300):
    """Runs npm install in work unless ready() says the packages are there, holding the
    folder's lock so that two tests never install into it at once."""
    if ready():
        return
    with open(os.path.join(work, ".npm-install.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ready():
            subprocess.run([shutil.which("npm"), "install", "--no-audit", "--no-fund",
                            "--silent"], cwd=work, check=True, timeout=timeout)
