#!/usr/bin/env python3
"""What the instruction-count plugin costs in TCG time: one plugin against
another on the same guest workload, runs interleaved.

The workload is tests/insns_exact.rs's guest: Debian's 6.1 kernel
(images/fetch-debian-kernel.sh, in the image cache) booting into
tests/fixtures/insns-exact/exact.c (2000 fresh pages touched, 1000 device
stores, 1000 calls pushing onto fresh pages) and powering off. Each run
prints QEMU's wall time, its CPU time (user + system) and the user
instructions of the program's window, which show what each plugin counts
(26017 retired; 54017 counting whole blocks).

  tools/insns-plugin-cost.py [--base REV] [--runs N] [--icount]

The plugin under test is the working tree's (images/build-qemu-plugin.sh);
the base is images/qemu-plugin/ at git revision REV (default HEAD), built
with the same header and flags. Needs what tests/insns_exact.rs needs.
"""

import argparse
import glob
import os
import re
import resource
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES, MMIO_ITERS, CALLS = 2000, 1000, 1000


def cache_dir():
    if os.environ.get("BLKLAB_IMAGE_CACHE"):
        return os.environ["BLKLAB_IMAGE_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ["HOME"], ".cache")
    return os.path.join(base, "blklab", "images")


def run(argv, **kw):
    return subprocess.run(argv, check=True, stdout=subprocess.PIPE, **kw).stdout.decode()


def build_base(rev, tmp):
    """The plugin at `rev`, built as images/build-qemu-plugin.sh builds it."""
    headers = sorted(glob.glob(os.path.join(cache_dir(), "qemu-plugin-header-*", "qemu-plugin.h")))
    if not headers:
        sys.exit("no plugin header in the image cache: run images/build-qemu-plugin.sh first")
    src = os.path.join(tmp, "base")
    os.makedirs(src)
    for f in ("blklab-insns.c", "blklab-decode.h"):
        with open(os.path.join(src, f), "w") as out:
            out.write(run(["git", "-C", ROOT, "show", f"{rev}:images/qemu-plugin/{f}"]))
    so = os.path.join(src, "libblklab-insns.so")
    cflags = run(["pkg-config", "--cflags", "glib-2.0"]).split()
    run(["gcc", "-O2", "-shared", "-fPIC", "-std=gnu11", "-I" + os.path.dirname(headers[-1])]
        + cflags + ["-o", so, os.path.join(src, "blklab-insns.c"), "-lpthread"])
    return so


def initramfs(tmp):
    stage = os.path.join(tmp, "stage")
    for d in ("dev", "sys"):
        os.makedirs(os.path.join(stage, d))
    run(["gcc", "-static", "-O1", f"-DPAGES={PAGES}", f"-DMMIO_ITERS={MMIO_ITERS}", f"-DCALLS={CALLS}", "-o",
         os.path.join(stage, "init"), os.path.join(ROOT, "tests/fixtures/insns-exact/exact.c")])
    cpio = os.path.join(tmp, "initrd.cpio")
    with open(cpio, "wb") as out:
        subprocess.run("find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet", shell=True,
                       cwd=stage, stdout=out, check=True)
    return cpio


def user_count(ctl, path):
    s = socket.socket(socket.AF_UNIX)
    s.connect(ctl)
    s.sendall(f"dump {path}\n".encode())
    answer = s.makefile().readline()
    s.close()
    if not answer.startswith("ok"):
        sys.exit(f"the plugin answered {answer!r}")
    with open(path) as f:
        return sum(int(u) for u in re.findall(r" user (\d+)", f.read()))


def settled(ctl, path):
    """The user count once the program waits (it stops changing)."""
    last = None
    while True:
        n = user_count(ctl, path)
        if n == last:
            return n
        last = n
        time.sleep(0.1)


def boot(plugin, kernel, initrd, accel, tmp):
    """One boot: (wall seconds, QEMU's CPU seconds, window user count)."""
    ctl = os.path.join(tmp, "ctl.sock")
    argv = (["qemu-system-x86_64"] + accel
            + ["-m", "256M", "-display", "none", "-nodefaults", "-serial", "stdio",
               "-monitor", "none", "-no-reboot", "-nic", "none", "-device", "edu,addr=05.0",
               "-plugin", f"{plugin},ctl={ctl}", "-kernel", kernel, "-initrd", initrd,
               "-append", "console=ttyS0 quiet loglevel=3 panic=-1"])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    q = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    counts = []
    for line in q.stdout:
        line = line.decode(errors="replace")
        if line.startswith("EXACT error"):
            q.kill()
            sys.exit(line.strip())
        if line.startswith("EXACT ready") or line.startswith("EXACT end"):
            counts.append(settled(ctl, os.path.join(tmp, "d.insns")))
            q.stdin.write(b"go\n")
            q.stdin.flush()
    if q.wait() != 0 or len(counts) != 2:
        sys.exit(f"QEMU exited {q.returncode} after {len(counts)} markers")
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, counts[1] - counts[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="HEAD", help="git revision of the base plugin")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--icount", action="store_true",
                    help="one vCPU under -icount shift=0 (else two vCPUs, one thread each)")
    a = ap.parse_args()
    new = run(["sh", os.path.join(ROOT, "images/build-qemu-plugin.sh")]).strip().splitlines()[-1]
    kdir = os.path.join(cache_dir(), "kernel-6.1")
    subprocess.run(["sh", os.path.join(ROOT, "images/fetch-debian-kernel.sh"), "6.1", kdir],
                   check=True)
    accel = (["-accel", "tcg,thread=single", "-icount", "shift=0", "-smp", "1"] if a.icount
             else ["-accel", "tcg,thread=multi", "-smp", "2"])
    with tempfile.TemporaryDirectory() as tmp:
        plugins = {"base": build_base(a.base, tmp), "tree": new}
        initrd = initramfs(tmp)
        results = {k: [] for k in plugins}
        for i in range(a.runs):
            for name, so in plugins.items():
                wall, cpu, user = boot(so, os.path.join(kdir, "vmlinuz"), initrd, accel, tmp)
                results[name].append((wall, cpu))
                print(f"run {i + 1} {name}: wall {wall:.2f} s, cpu {cpu:.2f} s, "
                      f"window user instructions {user}", flush=True)
        for name, r in results.items():
            w = sorted(x[0] for x in r)
            c = sorted(x[1] for x in r)
            print(f"{name}: wall median {w[len(w) // 2]:.2f} s ({', '.join(f'{x:.2f}' for x in w)}), "
                  f"cpu median {c[len(c) // 2]:.2f} s ({', '.join(f'{x:.2f}' for x in c)})")


if __name__ == "__main__":
    main()
