"""Backups (issue 18 item 8): `sbx backup DEST` of a real service under `sbx up` with one
real guest, and `sbx restore` of it into a fresh data directory, where the sandbox,
stopped with its memory kept at backup time, resumes with its processes' memory (a file
in the guest's tmpfs) and its disk, and the account's key, snapshots and ledger are there.

The backed-up directory is moved away before the restore, so nothing restored can still
name it (disk images' backing files, vmd's guest.json, snapshotd's store). Refusals change
nothing: a backup while a sandbox runs (named), into a DEST that exists, of a directory
that is not a data directory; a restore into a non-empty directory, or of a backup with a
damaged file (its checksum), leaves no directory behind."""
import json
import os
import re
import shutil
import subprocess
import unittest

from sbxtest import BIN, Sbx, binary, main, wait_for


class BackupTest(unittest.TestCase):
    def refused(self, res, *texts):
        self.assertNotEqual(res.returncode, 0, res.stdout)
        for text in texts:
            self.assertIn(text, res.stderr)

    def test_backup_and_restore(self):
        image = os.path.realpath(os.path.join(BIN, "..", "image"))
        s = Sbx(self, "backup", settings={"image_dir": image})
        s.up()
        banner = wait_for(lambda: "admin API key:" in s.output() and s.output(), 30,
                          "sbx up's banner")
        key = re.search(r"admin API key:\s+(\S+)", banner).group(1)

        sb = s.cli_json("sandbox", "create", "--account", "admin@localhost", timeout=300)["id"]
        s.cli("sandbox", "exec", sb, "--", "sh", "-c",
              "echo in-memory > /dev/shm/mem; echo on-disk > /root/disk; sync", timeout=120)

        work = os.path.dirname(s.dir)
        dest = os.path.join(s.dir + "-backup")
        self.addCleanup(shutil.rmtree, dest, True)

        # Refused while the sandbox runs, naming it; nothing written.
        res = s.cli("backup", dest, check=False)
        self.refused(res, sb, "--stop-running", "failed_precondition")
        self.assertFalse(os.path.exists(dest) or os.path.exists(dest + ".partial"))
        # Not a data directory: refused, and not made one.
        missing = os.path.join(work, "sbxtest-no-such-dir")
        res = subprocess.run([binary("sbx"), "backup", dest, "--data-dir", missing],
                             capture_output=True, text=True, stdin=subprocess.DEVNULL)
        self.refused(res, "not an sbx data directory")
        self.assertFalse(os.path.exists(missing))

        res = s.cli("backup", dest, "--stop-running", timeout=300)
        self.assertIn(f"stopping {sb}", res.stdout)
        self.assertIn("backup done", res.stdout)
        self.assertEqual(s.cli_json("sandbox", "get", sb)["state"], "stopped")
        with open(os.path.join(dest, "backup.json")) as f:
            manifest = json.load(f)
        self.assertEqual(manifest["format"], "sbx-backup")
        self.assertEqual(manifest["data_dir"], os.path.realpath(s.dir))
        self.assertEqual(set(manifest["stores"]),
                         {"broker/control.db", "billing/billing.db", "snapshotd/snapshots.db",
                          "hooks/hooks.db"})
        self.assertTrue(all(v >= 1 for v in manifest["stores"].values()), manifest["stores"])
        paths = {e["path"]: e for e in manifest["entries"]}
        for p in ("sbx.conf", "tls/ca.key", "gateway/secret", f"vms/{sb}/memory.state",
                  f"vms/{sb}/overlay.qcow2"):
            self.assertIn(p, paths)
        self.assertFalse([p for p in paths if p.split("/")[0] in ("run", "logs")
                          or p.endswith(("-wal", "-shm"))], "run/, logs/ or SQLite side files")
        for e in manifest["entries"]:
            if e["type"] in ("file", "store"):
                self.assertRegex(e["sha256"], "^[0-9a-f]{64}$")
        # vms/ and snapshots/ share the stopped guest's memory: one file in the backup too.
        links = [e for e in manifest["entries"] if e["type"] == "hardlink"]
        self.assertTrue(links, "the memory state kept once")
        self.assertEqual(os.stat(os.path.join(dest, "data", links[0]["path"])).st_ino,
                         os.stat(os.path.join(dest, "data", links[0]["target"])).st_ino)
        # A DEST that exists is refused.
        self.refused(s.cli("backup", dest, check=False), "exists")
        snapshots = s.cli_json("snapshot", "list")["snapshots"]
        self.assertTrue(snapshots, "the stop's snapshot")

        guest_uid = os.stat(os.path.join(s.dir, "vms", sb)).st_uid
        # The original goes away: nothing restored may still lean on it.
        self.assertEqual(s.stop(), 0)
        moved = s.dir + "-moved"
        os.rename(s.dir, moved)
        self.addCleanup(shutil.rmtree, moved, True)

        r = Sbx(self, "restored", empty=True)
        # A damaged file: refused with its name, nothing made.
        secret = os.path.join(dest, "data", "gateway", "secret")
        with open(secret, "rb") as f:
            good = f.read()
        with open(secret, "wb") as f:
            f.write(bytes([good[0] ^ 1]) + good[1:])
        target = r.dir + "-damaged"
        res = subprocess.run([binary("sbx"), "restore", dest, "--data-dir", target],
                             capture_output=True, text=True, stdin=subprocess.DEVNULL)
        self.refused(res, "gateway/secret is damaged", "nothing was changed")
        self.assertFalse([n for n in os.listdir(work)
                          if n.startswith(os.path.basename(target))], "a half restore")
        self.assertIn(f"restoring {dest}", res.stdout)  # it got as far as the copies
        with open(secret, "wb") as f:
            f.write(good)
        # A directory that is not empty is refused.
        with open(os.path.join(r.dir, "stray"), "w") as f:
            f.write("x")
        self.refused(r.cli("restore", dest, check=False), "not an empty directory")
        os.unlink(os.path.join(r.dir, "stray"))

        res = r.cli("restore", dest, timeout=300)
        self.assertIn(f"sbx up --data-dir {os.path.realpath(r.dir)}", res.stdout)
        # The guest's QEMU uid has no passwd entry: kept by number.
        self.assertEqual(os.stat(os.path.join(r.dir, "vms", sb)).st_uid, guest_uid)
        self.assertEqual(paths[f"vms/{sb}"]["uid"], guest_uid)
        with open(os.path.join(r.dir, "vms", sb, "guest.json")) as f:
            self.assertTrue(json.load(f)["image"].startswith(os.path.realpath(r.dir) + "/"))
        r.up()
        self.assertEqual(r.cli_json("sandbox", "get", sb)["state"], "stopped")
        self.assertEqual([x["id"] for x in r.cli_json("snapshot", "list")["snapshots"]],
                         [x["id"] for x in snapshots])
        # The account's key, as before.
        status, _, body = r.https("GET", f"/v1/sandboxes/{sb}",
                                  headers={"Authorization": f"Bearer {key}"})
        self.assertEqual(status, 200, body)
        r.cli("sandbox", "resume", sb, timeout=300)
        res = r.cli("sandbox", "exec", sb, "--", "cat", "/dev/shm/mem", "/root/disk", timeout=120)
        self.assertEqual(res.stdout, "in-memory\non-disk\n")
        usage = r.cli_json("usage", "--account", "admin@localhost")
        self.assertEqual([x["sandbox_id"] for x in usage["sandboxes"]], [sb])
        self.assertGreater(usage["running_ms"], 0, usage)
        r.cli("sandbox", "delete", sb, timeout=120)


if __name__ == "__main__":
    main()
