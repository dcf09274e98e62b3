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
 * callback that adds the block's instruction count with atomic operations,
 * so counts from several vCPU threads (-accel tcg,thread=multi) are not lost.
 *
 * Arguments (-plugin libblklab-insns.so,ctl=PATH[,out=FILE]):
 *   ctl=PATH   listen on a Unix stream socket at PATH; each line received is a
 *              command, each gets one line back:
 *                "dump FILE"  write the counters to FILE, reply "ok FILE"
 *                             (or "error MESSAGE")
 *                "ping"       reply "pong"
 *   out=FILE   write the counters to FILE at exit
 *
 * Dump format (text, one record a line):
 *   blklab-insns 1
 *   vcpus N
 *   vcpu I kernel K user U          (one line per vCPU, I = 0..N-1)
 *   tb ADDR INSNS EXECS             (ADDR hex without 0x; kernel blocks that ran)
 *   end
 *
 * Built against the installed QEMU's include/qemu/qemu-plugin.h (plugin API
 * version 1 for QEMU 7.2) by images/build-qemu-plugin.sh.
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

typedef struct {
    uint64_t vaddr;
    uint64_t insns;
    uint64_t execs;
} Block;

typedef struct {
    uint64_t kernel;
    uint64_t user;
    uint8_t pad[48]; /* one cache line per vCPU */
} VcpuCount;

/* User blocks are not kept per address: their callback carries the block's
 * instruction count as its user data. */
static VcpuCount vcpus[MAX_VCPUS];
static int max_vcpu_seen = -1;

static GMutex lock;          /* guards blocks (the table, not the counts) */
static GHashTable *blocks;   /* vaddr -> Block*, kernel blocks only */
static char *ctl_path;
static char *out_path;
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

/* The user data of a translated kernel block: the address's counters and the
 * block's instruction count (blocks starting at one address may differ in
 * length, e.g. after a retranslation). */
typedef struct {
    Block *block;
    uint64_t n;
} KernelCb;

static void kernel_exec(unsigned int vcpu_index, void *udata)
{
    KernelCb *k = udata;
    __atomic_fetch_add(&k->block->insns, k->n, __ATOMIC_RELAXED);
    __atomic_fetch_add(&k->block->execs, 1, __ATOMIC_RELAXED);
    if (vcpu_index < MAX_VCPUS) {
        vcpus[vcpu_index].kernel += k->n; /* only this vCPU's thread writes it */
    }
}

static void user_exec(unsigned int vcpu_index, void *udata)
{
    if (vcpu_index < MAX_VCPUS) {
        vcpus[vcpu_index].user += (uint64_t)(uintptr_t)udata;
    }
}

static void tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    uint64_t vaddr = qemu_plugin_tb_vaddr(tb);
    uint64_t n = qemu_plugin_tb_n_insns(tb);
    if (vaddr >= KERNEL_START) {
        KernelCb *k = g_new0(KernelCb, 1); /* lives as long as QEMU: a TB may be
                                              retranslated, never freed here */
        k->n = n;
        g_mutex_lock(&lock);
        Block *b = g_hash_table_lookup(blocks, &vaddr);
        if (!b) {
            b = g_new0(Block, 1);
            b->vaddr = vaddr;
            g_hash_table_insert(blocks, &b->vaddr, b);
        }
        g_mutex_unlock(&lock);
        k->block = b;
        qemu_plugin_register_vcpu_tb_exec_cb(tb, kernel_exec,
                                             QEMU_PLUGIN_CB_NO_REGS, k);
    } else {
        qemu_plugin_register_vcpu_tb_exec_cb(tb, user_exec,
                                             QEMU_PLUGIN_CB_NO_REGS,
                                             (void *)(uintptr_t)n);
    }
}

static int write_dump(const char *path, char *err, size_t errlen)
{
    char *tmp = g_strdup_printf("%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
        g_free(tmp);
        return -1;
    }
    int n = __atomic_load_n(&max_vcpu_seen, __ATOMIC_RELAXED) + 1;
    fprintf(f, "blklab-insns 1\nvcpus %d\n", n);
    for (int i = 0; i < n && i < MAX_VCPUS; i++) {
        fprintf(f, "vcpu %d kernel %" PRIu64 " user %" PRIu64 "\n", i,
                __atomic_load_n(&vcpus[i].kernel, __ATOMIC_RELAXED),
                __atomic_load_n(&vcpus[i].user, __ATOMIC_RELAXED));
    }
    g_mutex_lock(&lock);
    GHashTableIter it;
    gpointer key, value;
    g_hash_table_iter_init(&it, blocks);
    while (g_hash_table_iter_next(&it, &key, &value)) {
        Block *b = value;
        uint64_t insns = __atomic_load_n(&b->insns, __ATOMIC_RELAXED);
        uint64_t execs = __atomic_load_n(&b->execs, __ATOMIC_RELAXED);
        if (execs) {
            fprintf(f, "tb %" PRIx64 " %" PRIu64 " %" PRIu64 "\n", b->vaddr,
                    insns, execs);
        }
    }
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
        } else {
            fprintf(stderr, "blklab-insns: unknown argument %s (want ctl=PATH, out=FILE)\n",
                    argv[i]);
            return -1;
        }
    }
    blocks = g_hash_table_new(g_int64_hash, g_int64_equal);
    if (ctl_path && start_ctl(ctl_path) != 0) {
        return -1;
    }
    qemu_plugin_register_vcpu_init_cb(id, vcpu_init);
    qemu_plugin_register_vcpu_tb_trans_cb(id, tb_trans);
    qemu_plugin_register_atexit_cb(id, plugin_exit, NULL);
    return 0;
}
