#!/usr/bin/env python3
"""Write the seed corpora under fuzz/corpus/ (small; committed). Run from
anywhere: python3 fuzz/make-seeds.py. The input formats are those of
src/fuzz.rs (blklab::fuzz)."""
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")
ROOT = os.path.dirname(HERE)

N, W, I = 1, 2, 4  # VRING_DESC_F_NEXT, _WRITE, _INDIRECT
QSIZE = 32
AVAIL = 16 * QSIZE
USED = (AVAIL + 6 + 2 * QSIZE + 3) & ~3


def ring_image():
    """A split ring of 32 at 0 with a read, write, flush, GET_ID, discard,
    an indirect read and a write-zeroes, as the request target lays it out."""
    mem = bytearray(0x4000)

    def put(at, b):
        mem[at:at + len(b)] = b

    def desc(table, i, addr, ln, flags, nxt):
        put(table + 16 * i, struct.pack("<QIHH", addr, ln, flags, nxt))

    def hdr(at, typ, sector):
        put(at, struct.pack("<IIQ", typ, 0, sector))

    heads = []
    # read of sector 1: header, 512 bytes, status
    hdr(0x1000, 0, 1)
    desc(0, 0, 0x1000, 16, N, 1); desc(0, 1, 0x2000, 512, W | N, 2); desc(0, 2, 0x3000, 1, W, 0)
    heads.append(0)
    # write of sector 2
    hdr(0x1010, 1, 2); put(0x2200, bytes(range(256)) * 2)
    desc(0, 3, 0x1010, 16, N, 4); desc(0, 4, 0x2200, 512, N, 5); desc(0, 5, 0x3001, 1, W, 0)
    heads.append(3)
    # flush
    hdr(0x1020, 4, 0)
    desc(0, 6, 0x1020, 16, N, 7); desc(0, 7, 0x3002, 1, W, 0)
    heads.append(6)
    # GET_ID
    hdr(0x1030, 8, 0)
    desc(0, 8, 0x1030, 16, N, 9); desc(0, 9, 0x2400, 20, W | N, 10); desc(0, 10, 0x3003, 1, W, 0)
    heads.append(8)
    # discard of 8 sectors at 16
    hdr(0x1040, 11, 0); put(0x1100, struct.pack("<QII", 16, 8, 0))
    desc(0, 11, 0x1040, 16, N, 12); desc(0, 12, 0x1100, 16, N, 13); desc(0, 13, 0x3004, 1, W, 0)
    heads.append(11)
    # indirect read of sector 0
    hdr(0x1050, 0, 0)
    desc(0x1200, 0, 0x1050, 16, N, 1); desc(0x1200, 1, 0x2600, 512, W | N, 2)
    desc(0x1200, 2, 0x3005, 1, W, 0)
    desc(0, 14, 0x1200, 48, I, 0)
    heads.append(14)
    # write-zeroes (unmap) of 8 sectors at 24
    hdr(0x1060, 13, 0); put(0x1110, struct.pack("<QII", 24, 8, 1))
    desc(0, 15, 0x1060, 16, N, 16); desc(0, 16, 0x1110, 16, N, 17); desc(0, 17, 0x3006, 1, W, 0)
    heads.append(15)
    put(AVAIL, struct.pack("<HH", 0, len(heads)) + b"".join(struct.pack("<H", h) for h in heads))
    # Only what is set: the rest of guest memory is zeros anyway.
    return bytes(mem).rstrip(b"\0")


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def request_seeds():
    img = ring_image()
    qb = 5  # queue size 1 << 5
    write("request", "mem", bytes([0x00, qb]) + img)
    write("request", "mem-writeback-event-idx-regions", bytes([0x70, qb]) + img)
    write("request", "null-readonly-4k-faults", bytes([0x0f, qb]) + img)


def msg(code, body=b"", fds=(), need_reply=False):
    """One message of blklab::fuzz::Daemon::vhost_user's input format."""
    out = bytes([code, 1 if need_reply else 0, len(fds)])
    for f in fds:
        out += f
    return out + struct.pack("<H", len(body)) + body


EVENTFD = b"\x00"


def memfd(pages, contents):
    return bytes([pages]) + struct.pack("<H", len(contents)) + contents


def vhost_user_seeds():
    img = ring_image()
    ua = 0x7F00_0000_0000
    feats = (1 << 32) | (1 << 30) | (1 << 29) | (1 << 28) | (1 << 9)
    proto = (1 << 0) | (1 << 3) | (1 << 9) | (1 << 15)
    region = struct.pack("<QQQQ", 0, 0x10000, ua, 0)
    head = (msg(1) + msg(2, struct.pack("<Q", feats)) + msg(15)
            + msg(16, struct.pack("<Q", proto)) + msg(3) + msg(17)
            + msg(24, struct.pack("<III", 0, 60, 0) + bytes(60)))
    rings = b""
    for q in (0, 1):
        rings += (msg(8, struct.pack("<II", q, QSIZE))
                  + msg(9, struct.pack("<IIQQQQ", q, 0, ua, ua + USED, ua + AVAIL, 0))
                  + msg(10, struct.pack("<II", q, 0))
                  + msg(12, struct.pack("<Q", q), [EVENTFD])
                  + msg(13, struct.pack("<Q", q), [EVENTFD])
                  + msg(18, struct.pack("<II", q, 1), need_reply=True))
    tail = bytes([0xFF]) + msg(11, struct.pack("<II", 0, 0)) + msg(11, struct.pack("<II", 1, 0))
    set_mem = msg(5, struct.pack("<II", 1, 0) + region, [memfd(16, img)], need_reply=True)
    add_reg = msg(37, struct.pack("<Q", 0) + region, [memfd(16, img)], need_reply=True)
    write("vhost_user", "set-mem-table", head + set_mem + rings + tail)
    write("vhost_user", "add-mem-reg", head + add_reg + rings + tail)
    # A region larger than its memfd (1 page for 16): mapped, then touched
    # past the file's end by the rings. It killed the daemon with SIGBUS:
    # kept as a crash input under tests/fixtures/fuzz (not a seed).
    short = msg(5, struct.pack("<II", 1, 0) + region, [memfd(1, img[:4096])], need_reply=True)
    crash = os.path.join(ROOT, "tests", "fixtures", "fuzz", "vhost_user")
    os.makedirs(crash, exist_ok=True)
    with open(os.path.join(crash, "crash-short-memfd"), "wb") as f:
        f.write(head + short + rings + tail)
    # Queue 0's avail ring starts 4 bytes before the end of guest memory
    # (flags and idx inside, the entries past it), avail idx 1, EVENT_IDX
    # on, a kick: the worker of b3897d5 popped nothing, saw avail idx !=
    # next_avail when it re-enabled notifications and looped for ever,
    # logging an error per pass; the next connection then timed out.
    # libFuzzer found it as a hang after ~10,000 inputs.
    spin_img = bytearray(img.ljust(0xFFFF, b"\0"))
    spin_img[0xFFFE] = 1
    spin_mem = msg(5, struct.pack("<II", 1, 0) + region, [memfd(16, bytes(spin_img))],
                   need_reply=True)
    spin_rings = (msg(8, struct.pack("<II", 0, QSIZE))
                  + msg(9, struct.pack("<IIQQQQ", 0, 0, ua, ua + USED, ua + 0xFFFC, 0))
                  + msg(10, struct.pack("<II", 0, 0))
                  + msg(12, struct.pack("<Q", 0), [EVENTFD])
                  + msg(13, struct.pack("<Q", 0), [EVENTFD])
                  + msg(18, struct.pack("<II", 0, 1), need_reply=True))
    with open(os.path.join(crash, "hang-avail-ring-at-memory-end"), "wb") as f:
        f.write(head + spin_mem + spin_rings + bytes([0xFF]) + bytes([0xFF])
                + msg(11, struct.pack("<II", 0, 0)))
    # Queue 0's used ring at the same address as its avail ring, so avail
    # idx (the image's requests) is also used idx, one or more ahead of the
    # base 0, then a kick and GET_VRING_BASE: each used entry the worker of
    # d6cbff2 added raised the index it popped against, its pass never
    # ended, GET_VRING_BASE was never answered and SIGTERM was ignored.
    # Now the ring is refused (its parts overlap) and the pass is bounded.
    loop_rings = (msg(8, struct.pack("<II", 0, QSIZE))
                  + msg(9, struct.pack("<IIQQQQ", 0, 0, ua, ua + AVAIL, ua + AVAIL, 0))
                  + msg(10, struct.pack("<II", 0, 0))
                  + msg(12, struct.pack("<Q", 0), [EVENTFD])
                  + msg(13, struct.pack("<Q", 0), [EVENTFD])
                  + msg(18, struct.pack("<II", 0, 1), need_reply=True))
    with open(os.path.join(crash, "hang-used-ring-over-avail-ring"), "wb") as f:
        f.write(head + set_mem + loop_rings + bytes([0xFF]) + bytes([0xFF])
                + msg(11, struct.pack("<II", 0, 0), need_reply=True))


def control_seeds():
    write("control", "commands",
          b'stats\nsnapshot warm up\n{"cmd":"snapshot","label":"a"}\nreset\nconfig\nprom\n'
          b'bogus\n\n{bad\n{"cmd":1}\n')


def text_seeds():
    src = os.path.join(ROOT, "guest-scripts", "scenarios")
    for n in ("smoke.scn", "seed000-virtio-tags.scn", "seed002-scsi-debug-multipath.scn"):
        d = os.path.join(CORPUS, "scenario")
        os.makedirs(d, exist_ok=True)
        shutil.copy(os.path.join(src, n), os.path.join(d, "seed-" + n))
    write("config", "two-disks.toml", b'''[[disk]]
socket = "/tmp/fast.sock"
disk = "mem"
size = "4G"
num-queues = 4
queues-per-thread = ["0x3", "0xc"]
latency = "uniform:50us..150us"
fail-every = ["10:read"]
fail-range = ["8..16"]
stall-every = "100:1ms"

[[disk]]
socket = "/tmp/lun.sock"
disk = "null"
size = "256G"
count = 12
read-only = true
tags = "shared"
depth = 64
tag-scope = "host"
poll = "50us"
''')


if __name__ == "__main__":
    request_seeds()
    vhost_user_seeds()
    control_seeds()
    text_seeds()
