"""The guest images (issue 19 item 2): the default image's tools, and the docker variant
booted by the one sandbox type the operator chose (image_dir.medium), under `sbx up` with
real QEMU microvm guests under TCG.

vmd.templates = "medium": the medium template is made of the image that type boots (a cold
boot of the docker variant: sbx-init starts dockerd and the agent answers once it does),
and the medium sandbox is restored from it, its dockerd running; the small one boots the
default image cold.

- small (the default image): git, gcc through make, node and npm run; no docker; its
  /etc/sbx/image-hash is the default image's.
- medium (the docker variant, build/image-docker, made by the integration.image_docker
  fixture): its image hash is the variant's; inside it a root filesystem of the guest's
  own dash and the libraries it needs is made into a tarball, `docker import`ed and
  `docker run` (its output: PID 1, its own hostname, eth0 from the bridge), then a
  Dockerfile FROM that image is built and run. No registry is reached.
"""
import glob
import json
import os
import unittest

from sbxtest import BIN, Sbx, main, wait_for

ADMIN = "admin@localhost"
IMAGE = os.path.realpath(os.path.join(BIN, "..", "image"))
DOCKER = os.path.realpath(os.environ.get("SBX_IMAGE_DOCKER") or os.path.join(BIN, "..",
                                                                              "image-docker"))

# A root filesystem of the guest's own dash and the libraries ldd names, as a tarball.
MAKE_ROOTFS = r"""set -e
d=$(mktemp -d)
mkdir -p "$d/bin" "$d/etc"
cp /bin/dash "$d/bin/sh"
for lib in $(ldd /bin/dash | grep -o '/[^ ]*'); do
    mkdir -p "$d$(dirname "$lib")"
    cp -L "$lib" "$d$lib"
done
tar -C "$d" -cf /root/tiny.tar .
tar -tf /root/tiny.tar | grep -c '' """


def input_hash(image):
    with open(os.path.join(image, "manifest.json")) as f:
        return json.load(f)["input_hash"]


class ImagesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.path.isfile(os.path.join(DOCKER, "manifest.json")):
            raise AssertionError(f"no docker variant at {DOCKER}: build it first (cmake --build "
                                 "build --target sbx-image-docker, or ctest -R integration."
                                 "image_docker)")
        cls.s = Sbx(cls, "images", settings={"image_dir": IMAGE, "image_dir.medium": DOCKER,
                                             "vmd.templates": "medium"})
        cls.s.up()

    @classmethod
    def addCleanup(cls, fn, *args):  # Sbx registers its cleanup on the class
        cls.addClassCleanup(fn, *args)

    def exec(self, sid, command, check=True):
        res = self.s.cli("sandbox", "exec", sid, "--json", "--", command, timeout=300)
        r = json.loads(res.stdout)
        if check:
            self.assertEqual(r["exitCode"], 0, f"{command}:\n{r['stdout']}\n{r['stderr']}")
        return r

    def create(self, kind):
        sb = self.s.cli_json("sandbox", "create", "--account", ADMIN, "--type", kind, timeout=300)
        self.assertEqual((sb["state"], sb["type"]), ("ready", kind))
        return sb["id"]

    def test_default_image_tools(self):
        sid = self.create("small")
        self.assertNotIn(f"sandbox={sid} from the", self.s.log("sbx-vmd"))  # booted
        r = self.exec(sid, "cat /etc/sbx/image-hash")
        self.assertEqual(r["stdout"].strip(), input_hash(IMAGE))
        # C through make and gcc, a git commit, node and npm.
        r = self.exec(sid, "mkdir -p /root/c && cd /root/c && "
                           "printf '#include <stdio.h>\\nint main(void) { puts(\"made by gcc\"); "
                           "return 0; }\\n' > hello.c && "
                           "printf 'hello: hello.c\\n\\tgcc -o hello hello.c\\n' > Makefile && "
                           "make -s && ./hello")
        self.assertEqual(r["stdout"], "made by gcc\n")
        r = self.exec(sid, "cd /root/c && git init -q && git add . && git -c user.name=t "
                           "-c user.email=t@example.com commit -q -m first && git log --format=%s")
        self.assertEqual(r["stdout"], "first\n")
        r = self.exec(sid, "node -e 'console.log(6 * 7, process.version)'")
        self.assertRegex(r["stdout"], r"^42 v18\.\d+\.\d+\n$")
        r = self.exec(sid, "npm --version")
        self.assertRegex(r["stdout"], r"^9\.\d+\.\d+\n$")
        r = self.exec(sid, "command -v docker dockerd", check=False)
        self.assertNotEqual(r["exitCode"], 0)
        self.assertEqual(r["stdout"], "")
        self.s.cli("sandbox", "delete", sid, timeout=120)

    def test_docker_variant(self):
        self.assertIn(f"medium sandboxes boot image {self.s.dir}/images/{input_hash(DOCKER)} "
                      "(image_dir.medium)", self.s.log("sbx-vmd"))
        # The medium template is made of the docker variant, and the sandbox restored
        # from it (its dockerd already running).
        ready = wait_for(lambda: glob.glob(os.path.join(self.s.dir, "templates", "*",
                                                        "*-medium-*", "qemu.version")),
                         600, "the medium template")
        self.assertEqual(os.path.basename(os.path.dirname(ready[0])).split("-")[0],
                         input_hash(DOCKER))
        sid = self.create("medium")
        self.assertIn(f"sandbox={sid} from the medium template", self.s.log("sbx-vmd"))
        r = self.exec(sid, "cat /etc/sbx/image-hash")
        self.assertEqual(r["stdout"].strip(), input_hash(DOCKER))
        # dockerd runs (started by sbx-init before the template was captured).
        r = self.exec(sid, "docker info --format '{{.Driver}} {{.CgroupVersion}}'")
        self.assertEqual(r["stdout"], "overlay2 2\n")
        r = self.exec(sid, MAKE_ROOTFS)
        self.assertGreater(int(r["stdout"]), 3)
        r = self.exec(sid, "docker import /root/tiny.tar tiny:1")
        self.assertRegex(r["stdout"], r"^sha256:[0-9a-f]{64}\n$")
        # Its own PID namespace, hostname (the container id) and network (docker0's veth);
        # only dash's builtins: the image has nothing else.
        r = self.exec(sid, "docker run --rm --pull never tiny:1 /bin/sh -c "
                           "'read name < /etc/hostname; echo hello from pid $$ on $name; "
                           "echo /sys/class/net/*'")
        lines = r["stdout"].splitlines()
        self.assertRegex(lines[0], r"^hello from pid 1 on [0-9a-f]{12}$")
        self.assertIn("/sys/class/net/eth0", lines[1].split())
        # A Dockerfile can start FROM it.
        r = self.exec(sid, "mkdir -p /root/ctx && printf 'FROM tiny:1\\nRUN echo built by RUN "
                           "> /built.txt\\nCMD [\"/bin/sh\", \"-c\", \"read l < /built.txt; echo $l\"]\\n' > "
                           "/root/ctx/Dockerfile && docker build -q -t tiny:2 /root/ctx >/dev/null "
                           "&& docker run --rm --pull never tiny:2")
        self.assertEqual(r["stdout"], "built by RUN\n")
        r = self.exec(sid, "docker images --format '{{.Repository}}:{{.Tag}}' | sort")
        self.assertEqual(r["stdout"], "tiny:1\ntiny:2\n")
        self.s.cli("sandbox", "delete", sid, timeout=120)


if __name__ == "__main__":
    main()
