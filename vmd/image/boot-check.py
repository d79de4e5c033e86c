#!/usr/bin/env python3
"""Boot the sbx guest image once (or --runs N times) under QEMU microvm and check it.

Usage: boot-check.py [options] IMAGE_DIR

IMAGE_DIR holds vmlinux, initrd.img and rootfs.ext4 (vmd/image/build-image.sh). Each
run spawns QEMU with a qcow2 overlay on rootfs.ext4, waits for "sbx-init: ready" on
the serial console, then, through the debug shell on ttyS0 (the image must not have
an agent, or must be booted with --shell), checks that:
  - python3 -c 'print(2**100)' prints 1267650600228229401496703205376
  - hostname is checkbox (sbx.hostname=checkbox)
  - /dev/virtio-ports/agent exists
  - ip addr shows 10.0.2.15
  - python3 -m http.server serves a file to curl (inside the guest)
  - the agent port carries data from the guest to the host's unix socket
It prints the time from spawn to ready, kills QEMU and exits 0 only if every check of
every run passed. Python 3 standard library only.
"""

import argparse
import ctypes
import mmap
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

READY = b"sbx-init: ready"
EXPECT_POW = "1267650600228229401496703205376"


# ------------------------------------------------------------------ host TSC kHz
def _tsc_from_sysfs():
    try:
        with open("/sys/devices/system/cpu/cpu0/tsc_freq_khz") as f:
            return int(f.read().strip()), "sysfs tsc_freq_khz"
    except (OSError, ValueError):
        return None


def _tsc_from_kernel_log():
    # The host kernel's own calibration: "tsc: Refined TSC clocksource calibration:
    # 2596.148 MHz" (preferred) or "tsc: Detected 2596.148 MHz processor".
    for cmd in (["dmesg"], ["journalctl", "-k", "-b", "-q", "--no-pager", "-g", "tsc:"]):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        for pat in (r"tsc: Refined TSC clocksource calibration: (\d+)\.(\d{3}) MHz",
                    r"tsc: Detected (\d+)\.(\d{3}) MHz processor"):
            m = re.findall(pat, out)
            if m:
                mhz, frac = m[-1]
                return int(mhz) * 1000 + int(frac), "kernel log (%s)" % cmd[0]
    return None


def _tsc_measured():
    # rdtsc through a 10-byte function in an executable mapping, against
    # CLOCK_MONOTONIC_RAW over ~200 ms. x86-64 only.
    if os.uname().machine != "x86_64":
        return None
    code = bytes([0x0F, 0x31,              # rdtsc
                  0x48, 0xC1, 0xE2, 0x20,  # shl rdx, 32
                  0x48, 0x09, 0xD0,        # or rax, rdx
                  0xC3])                   # ret
    try:
        buf = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except (OSError, ValueError, AttributeError):
        return None
    buf.write(code)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    rdtsc = ctypes.CFUNCTYPE(ctypes.c_uint64)(addr)
    clk = time.CLOCK_MONOTONIC_RAW
    samples = []
    for _ in range(3):
        t0, c0 = time.clock_gettime_ns(clk), rdtsc()
        time.sleep(0.07)
        t1, c1 = time.clock_gettime_ns(clk), rdtsc()
        samples.append((c1 - c0) * 1_000_000 // (t1 - t0))
    del rdtsc
    samples.sort()
    return samples[1], "measured (rdtsc vs CLOCK_MONOTONIC_RAW)"


def _tsc_from_cpuinfo():
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^cpu MHz\s*:\s*([\d.]+)", f.read(), re.M)
        if m:
            return int(float(m.group(1)) * 1000), "/proc/cpuinfo cpu MHz (may not be the TSC rate)"
    except OSError:
        pass
    return None


def host_tsc_khz():
    """(kHz, source) of the host TSC: under TCG the guest reads the host TSC."""
    for probe in (_tsc_from_sysfs, _tsc_from_kernel_log, _tsc_measured, _tsc_from_cpuinfo):
        r = probe()
        if r and r[0] > 100_000:
            return r
    raise SystemExit("boot-check: cannot determine the host TSC frequency")


# ------------------------------------------------------------------ QEMU
def kvm_usable():
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    os.close(fd)
    return True


def qemu_command(img, tmp, accel, tb_size, tsc_khz, mem, extra_append):
    if accel == "kvm":
        accel_opt = "kvm"
    else:
        accel_opt = "tcg" + (",tb-size=%d" % tb_size if tb_size else "")
    append = ("console=ttyS0 quiet tsc=reliable no_timer_check cryptomgr.notests "
              "tsc_early_khz=%d root=/dev/vda rw panic=-1 sbx.hostname=checkbox" % tsc_khz)
    if not tsc_khz:  # --omit-tsc-khz: reproduces the TCG calibration hang
        append = append.replace(" tsc_early_khz=0", "")
    if extra_append:
        append += " " + extra_append
    kernel = os.path.join(img, "vmlinux")
    return [
        "qemu-system-x86_64",
        "-M", "microvm,x-option-roms=off,pit=off,pic=off,isa-serial=on,rtc=on",
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
        "-cpu", "max", "-smp", "1", "-m", mem,
        "-accel", accel_opt,
        "-kernel", kernel, "-initrd", os.path.join(img, "initrd.img"),
        "-append", append,
        "-drive", "id=d0,file=%s,format=qcow2,if=none" % os.path.join(tmp, "overlay.qcow2"),
        "-device", "virtio-blk-device,drive=d0",
        "-netdev", "user,id=n0", "-device", "virtio-net-device,netdev=n0",
        "-device", "virtio-rng-device",
        "-device", "virtio-serial-device",
        "-chardev", "socket,id=c0,path=%s,server=on,wait=off" % os.path.join(tmp, "agent.sock"),
        "-device", "virtserialport,chardev=c0,name=agent",
        "-serial", "stdio",
    ]


class Console:
    """The guest's ttyS0 through QEMU's stdio: a reader thread collects the output."""

    def __init__(self, proc, logf):
        self.proc = proc
        self.buf = bytearray()
        self.cond = threading.Condition()
        self.logf = logf
        self.eof = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        fd = self.proc.stdout.fileno()
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:
                data = b""
            with self.cond:
                if not data:
                    self.eof = True
                    self.cond.notify_all()
                    return
                self.buf += data
                self.logf.write(data)
                self.logf.flush()
                self.cond.notify_all()

    def wait_for(self, pattern, timeout, start=0):
        """Wait until regex `pattern` (bytes) matches the output from `start`; return the match."""
        rx = re.compile(pattern, re.S)
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                m = rx.search(self.buf, start)
                if m:
                    return m
                left = deadline - time.monotonic()
                if left <= 0 or self.eof:
                    return None
                self.cond.wait(min(left, 0.5))

    def send(self, text):
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def mark(self):
        with self.cond:
            return len(self.buf)


_seq = [100]


def run_cmd(con, cmd, timeout):
    """Run `cmd` in the guest shell; return its output (CRLF -> LF) or None on timeout.

    The markers are printed by arithmetic expansion, so the echoed command line
    itself never matches them."""
    _seq[0] += 1
    n = _seq[0]
    start = con.mark()
    con.send("echo @@B$((%d+1)); %s; echo @@E$((%d+1))\n" % (n - 1, cmd, n - 1))
    m = con.wait_for(rb"@@B%d\r?\n(.*?)@@E%d" % (n, n), timeout, start)
    if not m:
        return None
    return m.group(1).decode(errors="replace").replace("\r\n", "\n")


def one_run(args, img, tsc_khz, run_no, probe=False):
    tmp = tempfile.mkdtemp(prefix="sbx-boot-check.")
    results = []
    ready_s = None
    ok = False
    proc = None
    logf = None
    logpath = os.path.join(tmp, "serial.log")
    try:
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b",
                        os.path.abspath(os.path.join(img, "rootfs.ext4")), "-F", "raw",
                        os.path.join(tmp, "overlay.qcow2")], check=True)
        cmd = qemu_command(img, tmp, args.accel, args.tb_size, tsc_khz, args.mem, args.append)
        if (run_no == 1 and not probe) or args.verbose:
            print("boot-check: " + " ".join(_shq(c) for c in cmd), flush=True)
        logf = open(logpath, "wb")
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        con = Console(proc, logf)
        timeout = args.kvm_probe_timeout if probe else args.timeout
        if not con.wait_for(re.escape(READY), timeout):
            if con.eof:
                try:
                    proc.wait(3)
                except subprocess.TimeoutExpired:
                    pass
            why = "QEMU exited (rc %s)" % proc.poll() if proc.poll() is not None else "HUNG"
            print("boot-check: %s: no '%s' after %.0f s: %s; serial log:\n%s" % (
                "KVM probe" if probe else "run %d" % run_no, READY.decode(),
                time.monotonic() - t0, why, _tail(con.buf)), flush=True)
            return False, None, [("ready", False, why)]
        ready_s = time.monotonic() - t0
        if probe:
            ok = True
            return True, ready_s, []
        print("boot-check: run %d: spawn -> ready %.2f s (QEMU RSS %s)" % (run_no, ready_s, _rss(proc.pid)), flush=True)

        # wait until the shell reads its input
        deadline = time.monotonic() + 30
        start = con.mark()
        while time.monotonic() < deadline:
            con.send("echo @@S$((6*7))\n")
            if con.wait_for(rb"@@S42", 1.0, start):
                break
        else:
            return False, ready_s, [("shell", False, "no shell prompt on ttyS0")]

        def check(name, cmd, pred, timeout=args.cmd_timeout):
            t = time.monotonic()
            out = run_cmd(con, cmd, timeout)
            good = out is not None and pred(out)
            detail = "timeout" if out is None else out.strip()[:200]
            results.append((name, good, "%s (%.2f s)" % (detail if not good else "ok", time.monotonic() - t)))

        check("python3 2**100", "python3 -c 'print(2**100)'", lambda o: EXPECT_POW in o.split())
        check("hostname", "hostname", lambda o: o.strip() == "checkbox")
        check("/dev/virtio-ports/agent", "ls -l /dev/virtio-ports/agent && test -c /dev/virtio-ports/agent && echo PORT-OK",
              lambda o: "PORT-OK" in o)
        check("ip addr 10.0.2.15", "ip addr show", lambda o: "inet 10.0.2.15/24" in o)

        check("python3 -m http.server + curl",
              "cd /tmp && (python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &) && echo sbx-http-ok > /tmp/probe.txt"
              " && for i in $(seq 100); do curl -fsS http://127.0.0.1:8000/probe.txt 2>/dev/null && break; sleep 0.1; done",
              lambda o: "sbx-http-ok" in o)

        # the agent channel: host connects to the socket, the guest writes to the port
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        try:
            s.connect(os.path.join(tmp, "agent.sock"))
            check("agent port guest->host", "echo sbx-port-hello > /dev/virtio-ports/agent && echo WROTE",
                  lambda o: "WROTE" in o)
            got = b""
            try:
                while b"sbx-port-hello" not in got:
                    d = s.recv(4096)
                    if not d:
                        break
                    got += d
            except socket.timeout:
                pass
            if b"sbx-port-hello" not in got:
                results.append(("agent port data on host", False, "host got %r" % got[:80]))
        finally:
            s.close()

        ok = all(r[1] for r in results)
        print("boot-check: run %d: checks done (QEMU RSS %s)" % (run_no, _rss(proc.pid)), flush=True)
        return ok, ready_s, results
    finally:
        if proc is not None:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        for name, good, detail in results:
            print("boot-check: run %d:   %-26s %s  %s" % (run_no, name, "PASS" if good else "FAIL", detail), flush=True)
        if logf is not None:
            logf.close()
        if (ok or probe) and not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print("boot-check: run %d: kept %s (serial.log, overlay.qcow2)" % (run_no, tmp), flush=True)


def _rss(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            m = re.search(r"^VmRSS:\s*(\d+) kB", f.read(), re.M)
        return "%d MiB" % (int(m.group(1)) // 1024) if m else "?"
    except OSError:
        return "?"


def _tail(buf, n=2000):
    return bytes(buf[-n:]).decode(errors="replace")


def _shq(s):
    return s if re.fullmatch(r"[\w@%+=:,./-]+", s) else "'" + s.replace("'", "'\\''") + "'"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("image_dir", nargs="?")
    ap.add_argument("--runs", type=int, default=1, help="boot N times (default 1)")
    ap.add_argument("--accel", choices=["auto", "kvm", "tcg"], default=os.environ.get("SBX_ACCEL", "auto"),
                    help="auto: kvm when /dev/kvm opens and a KVM guest boots, else tcg (env SBX_ACCEL)")
    ap.add_argument("--tb-size", type=int, default=64, help="TCG translation cache MiB (0: QEMU default)")
    ap.add_argument("--mem", default="512M")
    ap.add_argument("--timeout", type=float, default=60, help="seconds to wait for 'sbx-init: ready'")
    ap.add_argument("--cmd-timeout", type=float, default=30, help="seconds per shell check")
    ap.add_argument("--kvm-probe-timeout", type=float, default=10,
                    help="--accel auto: seconds a KVM guest gets to reach ready before TCG is used")
    ap.add_argument("--tsc-khz", type=int, help="override the host TSC frequency")
    ap.add_argument("--omit-tsc-khz", action="store_true",
                    help="leave tsc_early_khz out (to reproduce the TCG boot hang it prevents)")
    ap.add_argument("--append", default="", help="extra kernel command line parameters")
    ap.add_argument("--keep", action="store_true", help="keep the temp dirs (serial log, overlay)")
    ap.add_argument("--print-tsc-khz", action="store_true", help="print the host TSC kHz and its source, exit")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()

    if args.print_tsc_khz:
        khz, src = host_tsc_khz()
        print(khz, src)
        return 0
    img = args.image_dir
    if not img:
        ap.error("IMAGE_DIR is required")
    for f in ("vmlinux", "initrd.img", "rootfs.ext4"):
        if not os.path.isfile(os.path.join(img, f)):
            print("boot-check: %s missing in %s (run build-image.sh)" % (f, img), file=sys.stderr)
            return 2
    if args.omit_tsc_khz:
        tsc_khz, src = 0, "nowhere (--omit-tsc-khz: tsc_early_khz left out)"
    elif args.tsc_khz:
        tsc_khz, src = args.tsc_khz, "--tsc-khz"
    else:
        tsc_khz, src = host_tsc_khz()
    if args.accel == "auto":
        args.accel = "tcg"
        if kvm_usable():
            # /dev/kvm can open and still be useless: on nested hosts whose KVM runs
            # only real mode, QEMU aborts on MSR 0x10a with -cpu max, or the guest hangs
            # silently. Only a guest that boots proves KVM works.
            args.accel = "kvm"
            ok, t, _ = one_run(args, img, tsc_khz, 0, probe=True)
            if ok:
                print("boot-check: KVM probe booted in %.2f s: using KVM" % t, flush=True)
            else:
                print("boot-check: /dev/kvm is present but a KVM guest does not boot: using TCG", flush=True)
                args.accel = "tcg"
    print("boot-check: accel %s, host TSC %d kHz from %s" % (args.accel, tsc_khz, src), flush=True)

    times, failures, hangs = [], 0, 0
    for i in range(1, args.runs + 1):
        ok, ready_s, results = one_run(args, img, tsc_khz, i)
        if ready_s is not None:
            times.append(ready_s)
        else:
            hangs += 1
        if not ok:
            failures += 1
    summary = " ".join("%.2f" % t for t in times)
    print("boot-check: %d run(s), accel %s: spawn->ready [%s] s%s; %d failed, %d without ready" % (
        args.runs, args.accel, summary,
        (" (median %.2f)" % sorted(times)[len(times) // 2]) if times else "", failures, hangs))
    print("%d passed, %d failed" % (args.runs - failures, failures))
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
