/*
 * blklab-insns: a QEMU TCG plugin counting executed guest instructions.
 *
 * Copyright (C) 2026 the blklab authors
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 *
 * Per vCPU: instructions executed at kernel addresses (x86-64: the top bit
 * set, >= 0xffff800000000000) and at user addresses. Per kernel translation
 * block start address: instructions executed in blocks starting there and
 * how often such a block ran (the entries of a function, when the address is
 * the function's). Every count is exact: each block execution runs a
 * callback that adds the block's instruction count; per-address counters
 * are shared between vCPUs and use atomic operations, so counts from
 * several vCPU threads (-accel tcg,thread=multi) are not lost.
 *
 * Levels. When the emulated CPU runs a hypervisor (QEMU's TCG emulates
 * AMD SVM for -cpu EPYC and the like), each count is kept apart by level:
 * level 1 is the machine's own code (for a nested lab: the host kernel with
 * KVM, its QEMU, its processes), level 2 the code run in SVM guest mode (the
 * nested guest). A vCPU is at level 1 until it executes VMRUN
 * (0f 01 d8): a callback on each translated VMRUN sets the vCPU's level to
 * 2. #VMEXIT resumes the host at the instruction after the VMRUN (QEMU's
 * helper_vmrun saves eip + the instruction's length as the host's RIP in
 * the host save area, do_vmexit reloads it; an invalid VMCB exits the same
 * way), so the translation block starting there, the "return block", runs
 * a callback that sets level 1 before it counts. VMRUN ends its block
 * (DISAS_NORETURN), and that block's counting callback ran at the block's
 * start, before the VMRUN's, so it counts at level 1.
 *
 * Return blocks are recognised by the host address of their code
 * (qemu_plugin_insn_haddr: where QEMU maps the guest-physical page), not by
 * virtual address: the nested guest's kernel modules live at the same
 * virtual addresses as the host's kvm_amd and could start a block at the
 * same address, never on the same physical page. A VMRUN whose next
 * instruction is on the next virtual page (the VMRUN ends exactly at a page
 * end, or spans two) cannot say which physical page that is; its return
 * point is then recognised by virtual address alone (a kernel block
 * starting there), which is exact unless the nested guest runs a kernel
 * block at that very address.
 *
 * Levels by address (l2ram=PATH). Under -icount QEMU restarts blocks that
 * touch a device partway (cpu_io_recompile), the rerun without the
 * plugin's execution callbacks, and may take an interrupt between a
 * VMRUN's callback and the VMRUN: the VMRUN tracking above then loses
 * transitions. So a lab that knows where its nested guest's RAM lies in
 * the machine's memory names it: PATH is the file of the memory backend
 * that holds the level-2 guest's RAM and nothing else (the nested lab
 * gives the host a second NUMA node on that backend and backs its guests'
 * RAM with the node's huge pages, which nothing else may use). Each block
 * is then counted at the level its code's place says, fixed when it is
 * translated: level 2 when its first instruction lies in a mapping of
 * PATH (/proc/self/maps, read at the first translation), else level 1.
 * The nested guest's code only ever runs from its RAM (its firmware's ROM
 * aside, while it boots) and the host never runs code from that RAM. The
 * VMRUN tracking still runs and counts VMRUNs; "disagree" counts the
 * block executions where it and the address differ: 0 in any window
 * without -icount (tests/nested_levels.rs checks it), a diagnostic under
 * -icount.
 *
 * QEMU keys translation blocks by their physical address and flags, and
 * the flags (cpu_get_tb_cpu_state: env->hflags) include HF_GUEST_MASK, so a
 * translated block only ever runs at one level. The plugin checks this:
 * "mixed" counts the translated blocks it saw run at both levels, which is
 * 0 unless the level tracking went wrong (a VMRUN that faulted instead of
 * entering the guest, a vCPU reset in guest mode, a nested guest running
 * VMRUN itself). Per vCPU, "vmruns" counts VMRUN executions and "returns"
 * executions of return blocks, i.e. the #VMEXITs the plugin saw: at any
 * dump they are equal, or vmruns is one more while the vCPU is in the
 * guest. Without SVM everything is level 1.
 *
 * Arguments (-plugin libblklab-insns.so,ctl=PATH[,out=FILE][,l2ram=FILE]):
 *   ctl=PATH   listen on a Unix stream socket at PATH; each line received is a
 *              command, each gets one line back:
 *                "dump FILE"  write the counters to FILE, reply "ok FILE"
 *                             (or "error MESSAGE")
 *                "ping"       reply "pong"
 *   out=FILE   write the counters to FILE at exit
 *   l2ram=FILE levels by address: FILE backs level 2's RAM (see above)
 *
 * Dump format (text, one record a line):
 *   blklab-insns 3
 *   levels vmrun|address            (how levels are told apart)
 *   vcpus N
 *   vcpu I kernel K user U l2kernel K2 l2user U2 vmruns R returns X
 *                                   (one line per vCPU, I = 0..N-1; K, U at
 *                                    level 1, K2, U2 at level 2)
 *   mixed M                         (translated blocks seen at both levels
 *                                    by the VMRUN tracking)
 *   disagree D                      (block executions whose address level
 *                                    is not the VMRUN tracking's; 0 by
 *                                    levels vmrun)
 *   tb ADDR INSNS EXECS             (level 1 kernel blocks that ran; ADDR hex
 *                                    without 0x)
 *   tb2 ADDR INSNS EXECS            (level 2 kernel blocks that ran)
 *   end
 *
 * Built against the installed QEMU's include/qemu/qemu-plugin.h (plugin API
 * version 4 for QEMU 10.0, 1 for QEMU 7.2) by images/build-qemu-plugin.sh.
 */
#include <errno.h>
#include <glib.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <qemu-plugin.h>

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

#define KERNEL_START 0xffff800000000000ULL
#define MAX_VCPUS 256
#define PAGE_MASK (~(uint64_t)0xfff) /* x86's 4 KiB target page */
#define LEVELS 2                     /* index 0: level 1, index 1: level 2 */

typedef struct {
    uint64_t vaddr;
    uint64_t insns[LEVELS];
    uint64_t execs[LEVELS];
} Block;

typedef struct {
    uint64_t kernel[LEVELS];
    uint64_t user[LEVELS];
    uint64_t vmruns;
    uint64_t returns;
    uint64_t level;    /* 0 or 1: the index of the vCPU's current level */
    uint64_t disagree; /* executions whose address level is not `level` */
} VcpuCount;
_Static_assert(sizeof(VcpuCount) == 64, "one cache line per vCPU");

/* Only the vCPU's own thread writes its entry (the dump reads it). */
static VcpuCount vcpus[MAX_VCPUS];
static int max_vcpu_seen = -1;
static uint64_t mixed;

static GMutex lock;           /* guards the tables below (not the counts) */
static GHashTable *blocks;    /* vaddr -> Block*, kernel blocks only */
static GHashTable *ret_haddr; /* host addresses after a VMRUN */
static GHashTable *ret_vaddr; /* the same by vaddr, for VMRUNs at a page end */
static char *ctl_path;
static char *out_path;

/* Levels by address: the host address ranges of l2ram's mappings. */
#define MAX_L2_RANGES 8
static char *l2ram_path;
static uintptr_t l2_lo[MAX_L2_RANGES], l2_hi[MAX_L2_RANGES];
static int l2_ranges = -1; /* -1: not read yet; 0: none found (an error) */
static int listen_fd = -1;

static void note_vcpu(unsigned int idx)
{
    int cur = __atomic_load_n(&max_vcpu_seen, __ATOMIC_RELAXED);
    while ((int)idx > cur &&
           !__atomic_compare_exchange_n(&max_vcpu_seen, &cur, (int)idx, false,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

static void vcpu_init(qemu_plugin_id_t id, unsigned int vcpu_index)
{
    note_vcpu(vcpu_index);
}

/* The user data of a translated block: its instruction count, the levels
 * it ran at (bit 0: level 1, bit 1: level 2), and for a kernel block the
 * counters of its start address (blocks starting at one address may differ
 * in length, e.g. after a retranslation, or be two blocks, one per level). */
typedef struct {
    Block *block; /* NULL for a user block */
    uint64_t n;
    uint32_t levels;
    int32_t fixed; /* levels by address: the block's level index; else -1 */
} BlockCb;

/* Note that the block ran at `lvl`; count it once if it has now run at
 * both levels. Writes only on a block's first run at a level. */
static inline void note_level(BlockCb *b, uint64_t lvl)
{
    uint32_t bit = 1u << lvl;
    if (!(__atomic_load_n(&b->levels, __ATOMIC_RELAXED) & bit)) {
        uint32_t old = __atomic_fetch_or(&b->levels, bit, __ATOMIC_RELAXED);
        if (old && !(old & bit)) {
            __atomic_fetch_add(&mixed, 1, __ATOMIC_RELAXED);
        }
    }
}

static inline void count(VcpuCount *v, BlockCb *b)
{
    uint64_t lvl = v->level;
    note_level(b, lvl);
    if (b->fixed >= 0) {
        v->disagree += (uint64_t)b->fixed != lvl;
        lvl = (uint64_t)b->fixed;
    }
    if (b->block) {
        __atomic_fetch_add(&b->block->insns[lvl], b->n, __ATOMIC_RELAXED);
        __atomic_fetch_add(&b->block->execs[lvl], 1, __ATOMIC_RELAXED);
        v->kernel[lvl] += b->n;
    } else {
        v->user[lvl] += b->n;
    }
}

static void block_exec(unsigned int vcpu_index, void *udata)
{
    if (vcpu_index < MAX_VCPUS) {
        count(&vcpus[vcpu_index], udata);
    }
}

/* A return block: the host resumes here after #VMEXIT. */
static void return_exec(unsigned int vcpu_index, void *udata)
{
    if (vcpu_index < MAX_VCPUS) {
        VcpuCount *v = &vcpus[vcpu_index];
        v->level = 0;
        v->returns++;
        count(v, udata);
    }
}

static void vmrun_exec(unsigned int vcpu_index, void *udata)
{
    if (vcpu_index < MAX_VCPUS) {
        vcpus[vcpu_index].level = 1;
        vcpus[vcpu_index].vmruns++;
    }
}

/* VMRUN: 0f 01 d8, after any legacy or REX prefixes. */
static bool is_vmrun(const struct qemu_plugin_insn *insn)
{
    uint8_t buf[16];
    size_t size = qemu_plugin_insn_size(insn);
    if (size < 3 || size > sizeof(buf)) {
        return false;
    }
#if QEMU_PLUGIN_VERSION >= 3
    if (qemu_plugin_insn_data(insn, buf, sizeof(buf)) < size) {
        return false;
    }
#else
    memcpy(buf, qemu_plugin_insn_data(insn), size);
#endif
    for (size_t i = 0; i + 3 < size; i++) {
        uint8_t p = buf[i];
        bool prefix = p == 0x66 || p == 0x67 || p == 0xf2 || p == 0xf3 ||
                      p == 0x2e || p == 0x36 || p == 0x3e || p == 0x26 ||
                      p == 0x64 || p == 0x65 || (p & 0xf0) == 0x40;
        if (!prefix) {
            return false;
        }
    }
    return buf[size - 3] == 0x0f && buf[size - 2] == 0x01 && buf[size - 1] == 0xd8;
}

/* Remember where a VMRUN's host resumes. Called with the lock held. */
static void note_vmrun(const struct qemu_plugin_insn *insn)
{
    uint64_t vaddr = qemu_plugin_insn_vaddr(insn);
    uint64_t next = vaddr + qemu_plugin_insn_size(insn);
    uint8_t *h = qemu_plugin_insn_haddr(insn);
    if (h && (vaddr & PAGE_MASK) == (next & PAGE_MASK)) {
        g_hash_table_add(ret_haddr, h + (next - vaddr));
    } else {
        uint64_t *key = g_new(uint64_t, 1);
        *key = next;
        g_hash_table_add(ret_vaddr, key);
    }
}

static bool is_return(struct qemu_plugin_tb *tb, uint64_t vaddr)
{
    void *h = qemu_plugin_insn_haddr(qemu_plugin_tb_get_insn(tb, 0));
    return (h && g_hash_table_contains(ret_haddr, h)) ||
           g_hash_table_contains(ret_vaddr, &vaddr);
}

/* The mappings of l2ram_path in this process (QEMU's): called once, at
 * the first translation (the machine's RAM is mapped by then), with the
 * lock held. */
static void read_l2_ranges(void)
{
    l2_ranges = 0;
    char *want = realpath(l2ram_path, NULL);
    FILE *f = fopen("/proc/self/maps", "r");
    if (!want || !f) {
        fprintf(stderr, "blklab-insns: l2ram=%s: %s\n", l2ram_path, strerror(errno));
        free(want);
        if (f) {
            fclose(f);
        }
        return;
    }
    char line[4352];
    while (fgets(line, sizeof(line), f) && l2_ranges < MAX_L2_RANGES) {
        uintptr_t lo, hi;
        int path_at = 0;
        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %*s %*s %*s %*s %n", &lo, &hi,
                   &path_at) < 2 || !path_at) {
            continue;
        }
        char *path = line + path_at;
        path[strcspn(path, "\n")] = 0;
        char *deleted = strstr(path, " (deleted)");
        if (deleted) {
            *deleted = 0;
        }
        if (strcmp(path, want) == 0) {
            l2_lo[l2_ranges] = lo;
            l2_hi[l2_ranges] = hi;
            l2_ranges++;
        }
    }
    fclose(f);
    if (!l2_ranges) {
        fprintf(stderr, "blklab-insns: l2ram=%s is not mapped by QEMU (want a memory "
                        "backend's mem-path)\n", want);
    }
    free(want);
}

/* Levels by address: the level index of code at host address h. Called
 * with the lock held. */
static int32_t address_level(const void *h)
{
    if (l2_ranges < 0) {
        read_l2_ranges();
    }
    for (int i = 0; i < l2_ranges; i++) {
        if ((uintptr_t)h >= l2_lo[i] && (uintptr_t)h < l2_hi[i]) {
            return 1;
        }
    }
    return 0;
}

/* The block's fixed level index, or -1 without l2ram. */
static int32_t fixed_level(struct qemu_plugin_tb *tb, size_t n)
{
    if (!l2ram_path || !n) {
        return -1;
    }
    void *h = qemu_plugin_insn_haddr(qemu_plugin_tb_get_insn(tb, 0));
    g_mutex_lock(&lock);
    int32_t lvl = address_level(h);
    g_mutex_unlock(&lock);
    return lvl;
}

static void tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    uint64_t vaddr = qemu_plugin_tb_vaddr(tb);
    size_t n = qemu_plugin_tb_n_insns(tb);
    /* Lives as long as QEMU: a TB may be retranslated, never freed here. */
    BlockCb *b = g_new0(BlockCb, 1);
    b->n = n;
    b->fixed = fixed_level(tb, n);
    if (vaddr < KERNEL_START) {
        /* VMRUN needs CPL 0, and so does the block it returns to. */
        qemu_plugin_register_vcpu_tb_exec_cb(tb, block_exec,
                                             QEMU_PLUGIN_CB_NO_REGS, b);
        return;
    }
    struct qemu_plugin_insn *last = n ? qemu_plugin_tb_get_insn(tb, n - 1) : NULL;
    bool vmrun = last && is_vmrun(last);
    g_mutex_lock(&lock);
    Block *blk = g_hash_table_lookup(blocks, &vaddr);
    if (!blk) {
        blk = g_new0(Block, 1);
        blk->vaddr = vaddr;
        g_hash_table_insert(blocks, &blk->vaddr, blk);
    }
    if (vmrun) {
        note_vmrun(last);
    }
    bool ret = n && is_return(tb, vaddr);
    g_mutex_unlock(&lock);
    b->block = blk;
    qemu_plugin_register_vcpu_tb_exec_cb(tb, ret ? return_exec : block_exec,
                                         QEMU_PLUGIN_CB_NO_REGS, b);
    if (vmrun) {
        /* VMRUN ends its block (QEMU: DISAS_NORETURN), so it is the last. */
        qemu_plugin_register_vcpu_insn_exec_cb(last, vmrun_exec,
                                               QEMU_PLUGIN_CB_NO_REGS, NULL);
    }
}

static void write_blocks(FILE *f, const char *tag, int lvl)
{
    GHashTableIter it;
    gpointer key, value;
    g_hash_table_iter_init(&it, blocks);
    while (g_hash_table_iter_next(&it, &key, &value)) {
        Block *b = value;
        uint64_t insns = __atomic_load_n(&b->insns[lvl], __ATOMIC_RELAXED);
        uint64_t execs = __atomic_load_n(&b->execs[lvl], __ATOMIC_RELAXED);
        if (execs) {
            fprintf(f, "%s %" PRIx64 " %" PRIu64 " %" PRIu64 "\n", tag,
                    b->vaddr, insns, execs);
        }
    }
}

static int write_dump(const char *path, char *err, size_t errlen)
{
    g_mutex_lock(&lock);
    bool unmapped = l2ram_path && l2_ranges == 0;
    g_mutex_unlock(&lock);
    if (unmapped) {
        snprintf(err, errlen, "l2ram=%s is not mapped by QEMU: levels by address "
                 "cannot be told", l2ram_path);
        return -1;
    }
    char *tmp = g_strdup_printf("%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
        g_free(tmp);
        return -1;
    }
    int n = __atomic_load_n(&max_vcpu_seen, __ATOMIC_RELAXED) + 1;
    fprintf(f, "blklab-insns 3\nlevels %s\nvcpus %d\n",
            l2ram_path ? "address" : "vmrun", n);
    uint64_t disagree = 0;
    for (int i = 0; i < n && i < MAX_VCPUS; i++) {
        VcpuCount *v = &vcpus[i];
        fprintf(f,
                "vcpu %d kernel %" PRIu64 " user %" PRIu64 " l2kernel %" PRIu64
                " l2user %" PRIu64 " vmruns %" PRIu64 " returns %" PRIu64 "\n",
                i, __atomic_load_n(&v->kernel[0], __ATOMIC_RELAXED),
                __atomic_load_n(&v->user[0], __ATOMIC_RELAXED),
                __atomic_load_n(&v->kernel[1], __ATOMIC_RELAXED),
                __atomic_load_n(&v->user[1], __ATOMIC_RELAXED),
                __atomic_load_n(&v->vmruns, __ATOMIC_RELAXED),
                __atomic_load_n(&v->returns, __ATOMIC_RELAXED));
        disagree += __atomic_load_n(&v->disagree, __ATOMIC_RELAXED);
    }
    fprintf(f, "mixed %" PRIu64 "\n", __atomic_load_n(&mixed, __ATOMIC_RELAXED));
    fprintf(f, "disagree %" PRIu64 "\n", disagree);
    g_mutex_lock(&lock);
    write_blocks(f, "tb", 0);
    write_blocks(f, "tb2", 1);
    g_mutex_unlock(&lock);
    fprintf(f, "end\n");
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        g_free(tmp);
        return -1;
    }
    g_free(tmp);
    return 0;
}

static void reply(int fd, const char *text)
{
    size_t len = strlen(text);
    while (len > 0) {
        ssize_t w = write(fd, text, len);
        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            return;
        }
        text += w;
        len -= (size_t)w;
    }
}

static void serve_client(int fd)
{
    char buf[4096];
    size_t have = 0;
    for (;;) {
        ssize_t r = read(fd, buf + have, sizeof(buf) - 1 - have);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            return;
        }
        have += (size_t)r;
        buf[have] = 0;
        char *nl;
        while ((nl = memchr(buf, '\n', have))) {
            *nl = 0;
            char err[512];
            if (strncmp(buf, "dump ", 5) == 0) {
                if (write_dump(buf + 5, err, sizeof(err)) == 0) {
                    char *ok = g_strdup_printf("ok %s\n", buf + 5);
                    reply(fd, ok);
                    g_free(ok);
                } else {
                    char *e = g_strdup_printf("error %s\n", err);
                    reply(fd, e);
                    g_free(e);
                }
            } else if (strcmp(buf, "ping") == 0) {
                reply(fd, "pong\n");
            } else {
                reply(fd, "error unknown command (want: dump FILE, ping)\n");
            }
            size_t used = (size_t)(nl - buf) + 1;
            memmove(buf, nl + 1, have - used);
            have -= used;
        }
        if (have == sizeof(buf) - 1) {
            reply(fd, "error line too long\n");
            return;
        }
    }
}

static void *ctl_thread(void *arg)
{
    for (;;) {
        int fd = accept(listen_fd, NULL, NULL);
        if (fd < 0) {
            if (errno == EINTR) {
                continue;
            }
            return NULL;
        }
        serve_client(fd);
        close(fd);
    }
}

static void plugin_exit(qemu_plugin_id_t id, void *p)
{
    if (out_path) {
        char err[512];
        if (write_dump(out_path, err, sizeof(err)) != 0) {
            fprintf(stderr, "blklab-insns: %s\n", err);
        }
    }
    if (ctl_path) {
        unlink(ctl_path);
    }
}

static int start_ctl(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path)) {
        fprintf(stderr, "blklab-insns: ctl path too long: %s\n", path);
        return -1;
    }
    strcpy(sa.sun_path, path);
    unlink(path);
    listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        listen(listen_fd, 4) != 0) {
        fprintf(stderr, "blklab-insns: cannot listen on %s: %s\n", path,
                strerror(errno));
        return -1;
    }
    pthread_t t;
    if (pthread_create(&t, NULL, ctl_thread, NULL) != 0) {
        fprintf(stderr, "blklab-insns: cannot start the control thread\n");
        return -1;
    }
    pthread_detach(t);
    return 0;
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id,
                                           const qemu_info_t *info, int argc,
                                           char **argv)
{
    if (!info->system_emulation) {
        fprintf(stderr, "blklab-insns: only for system emulation\n");
        return -1;
    }
    if (strcmp(info->target_name, "x86_64") != 0) {
        fprintf(stderr, "blklab-insns: kernel/user split assumes x86_64, not %s\n",
                info->target_name);
        return -1;
    }
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "ctl=", 4) == 0) {
            ctl_path = g_strdup(argv[i] + 4);
        } else if (strncmp(argv[i], "out=", 4) == 0) {
            out_path = g_strdup(argv[i] + 4);
        } else if (strncmp(argv[i], "l2ram=", 6) == 0) {
            l2ram_path = g_strdup(argv[i] + 6);
        } else {
            fprintf(stderr, "blklab-insns: unknown argument %s (want ctl=PATH, out=FILE, l2ram=FILE)\n",
                    argv[i]);
            return -1;
        }
    }
    blocks = g_hash_table_new(g_int64_hash, g_int64_equal);
    ret_haddr = g_hash_table_new(g_direct_hash, g_direct_equal);
    ret_vaddr = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, NULL);
    if (ctl_path && start_ctl(ctl_path) != 0) {
        return -1;
    }
    qemu_plugin_register_vcpu_init_cb(id, vcpu_init);
    qemu_plugin_register_vcpu_tb_trans_cb(id, tb_trans);
    qemu_plugin_register_atexit_cb(id, plugin_exit, NULL);
    return 0;
}
