"""A real browser for the integration tests: Debian's chromium driven by playwright-core
(installed with npm into a folder of the build directory, once)."""
import os
import shutil

from npmwork import npm_install, place

HERE = os.path.dirname(os.path.abspath(__file__))


def browser_script(test, script, folder):
    """(node, path): script (a driver beside this file) ready to run in <build>/folder,
    with browser/package.json's modules and browser/launch.mjs beside it."""
    node, npm = shutil.which("node"), shutil.which("npm")
    test.assertTrue(node and npm, "node and npm are needed for the browser test")
    test.assertTrue(os.access("/usr/bin/chromium", os.X_OK),
                    "Debian's chromium is needed (scripts/install-deps.sh)")
    work = os.path.join(os.environ.get("SBX_BIN", os.getcwd()), "..", folder)
    os.makedirs(work, exist_ok=True)
    for name in ("package.json", "launch.mjs"):
        place(os.path.join(HERE, "browser", name), work)
    place(os.path.join(HERE, script), work)
    npm_install(work, lambda: os.path.isdir(os.path.join(work, "node_modules",
                                                         "playwright-core")))
    return node, os.path.join(work, script)
