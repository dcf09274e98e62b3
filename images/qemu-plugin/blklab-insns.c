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
 * the function's). The counts are of retired instructions, with the one
 * exception below ("Retired instructions"); per-address counters are
 * shared between vCPUs and use atomic operations, so counts from several
 * vCPU threads (-accel tcg,thread=multi) are not lost.
 *
 * Retired instructions. Each block execution runs a callback when the
 * block starts, which adds the block's whole instruction count; but a
 * block does not always finish. An instruction that faults (a page fault
 * on a load or store) leaves the block there and runs again after the
 * handler, from another block. An instruction that touches a device
 * (MMIO) anywhere but last in its block makes QEMU (cpu_io_recompile; in
 * QEMU 10 with or without -icount) leave the block before the access, run
 * that instruction alone in a block that gets no execution callbacks
 * (CF_MEMI_ONLY: memory callbacks only), and go on with a block from the
 * next instruction. Counted whole, such blocks counted their unfinished
 * part twice and the re-run instruction not at all. So each instruction
 * that may stop its block (one that touches memory or calls a helper that
 * can fault: blklab-decode.h's may_stop_block, which knows the common
 * register-only instructions) stores its 1-based index in the vCPU's
 * entry of a scoreboard before it runs (an inline store, no call), and the
 * first instruction after the last of them stores the block's length. The
 * vCPU's next block callback settles the previous block: when it started
 * only k of its n instructions, k - 1 retired, the k-th stopped it (it
 * retires when it runs again, counted by what runs it), and n - k + 1 are
 * taken back from every count the block added to: the vCPU's kernel or
 * user count at its level and its address's tb line, and that execution
 * too when k = 1 (the block runs again from its start). The callback finds
 * the entry without a call: QEMU flushes every translated block when it
 * moves a scoreboard. A 1-instruction block stores its own identity in
 * the vCPU's entry at its memory accesses, which QEMU instruments in a
 * re-run block too; a block whose identity is there but whose callback
 * did not run is a re-run, and counts its instruction at the next
 * callback. A dump settles each vCPU the same way without changing its
 * counts, reading them under a sequence lock against the vCPU's callback.
 * The dump's "cut" record counts the block executions cut short and the
 * re-runs counted. Inline stores were chosen over a callback per
 * instruction (a call each) and over counting from the next block's
 * address (faults and interrupts look alike there); all of it costs about
 * 15% more TCG time than counting whole blocks under -icount, 30% with a
 * thread per vCPU (docs/benchmarks.md).
 *
 * The last instruction of a block. Nothing of a block runs after its last
 * instruction starts, so a last instruction that stops its block looks
 * like one that finished. When it is one that touches memory whenever it
 * finishes (always_accesses_memory: CALL, RET, PUSH, POP, LEAVE, MOV to or
 * from memory, indirect JMP), a memory operation, which runs after the
 * access, stores the block's length + 1 (a 1-instruction block: its
 * identity, as above): a block whose last instruction started but did not
 * get there was stopped by it, typically a page fault on a call's push.
 * tests/insns_exact.rs checks a known number of user instructions across
 * 4000 page faults and 1000 device stores in the middle of blocks and
 * 1000 page faults on calls that end their blocks, under TCG and -icount.
 *
 * What stays approximate. A fault raised by the last instruction of a
 * block when that instruction is not one of those (a page fault on an ALU
 * instruction with a memory operand or a string instruction where a block
 * ends at a page boundary), or by the second memory access of one (a PUSH
 * of memory whose store faults after its load), counts that instruction
 * twice: one instruction too many per such fault, at most one per
 * exception the guest takes. Device accesses never stop a block there
 * (QEMU allows them in a block's last instruction). A REP string
 * instruction counts once per execution of its block: QEMU runs up to
 * 65536 iterations in one without -icount, one iteration per execution
 * under -icount. Plugin API version 1 (QEMU 7.2) has no per-vCPU inline
 * operations: blocks count whole there, and the dump says "cut
 * unavailable".
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
 * Arguments (-plugin libblklab-insns.so,ctl=PATH[,out=FILE][,l2ram=FILE][,mark=ADDR]):
 *   ctl=PATH   listen on a Unix stream socket at PATH; each line received is a
 *              command, each gets one line back:
 *                "dump FILE"  write the counters to FILE, reply "ok FILE"
 *                             (or "error MESSAGE")
 *                "tasks switch=ADDR comm=OFF pid=OFF tgid=OFF halt=ADDR"
 *                             follow and name the tasks, set the halt
 *                             function (see "Tasks"; each optional,
 *                             switch but the first time), reply
 *                             "ok tasks" (or "error MESSAGE")
 *                "ping"       reply "pong"
 *   out=FILE   write the counters to FILE at exit
 *   l2ram=FILE levels by address: FILE backs level 2's RAM (see above)
 *   retired=off count whole blocks (see retired_off below: what the lab
 *              passes for single-threaded TCG with more than one vCPU)
 *   mark=ADDR  marks: the kernel block at ADDR (hex) marks the would-be
 *              exits (see "Marks")
 *
 * Would-be exits. Besides instructions the plugin counts, per vCPU and
 * level, the guest's events that leave the guest on KVM (a VM exit, or host
 * work such as an ioeventfd write):
 *   hlt     HLT (f4) executions: a callback on each translated HLT, run
 *           before the instruction, once per execution.
 *   cpuid   CPUID (0f a2) executions: always intercepted on KVM.
 *   wrmsr   WRMSR (0f 30) executions by MSR: ECX read at execution
 *           (qemu_plugin_read_register; the callback asks for registers).
 *           x2APIC ICR 0x830 (an IPI), EOI 0x80b, TMICT 0x838 and
 *           TSC_DEADLINE 0x6e0 are the hot ones; every MSR gets its line.
 *   in/out  port I/O by port and direction: IN/OUT with an imm8 port
 *           (e4-e7) or DX (ec-ef), INS/OUTS (6c-6f, DX; a REP string
 *           instruction re-executes per iteration, so each iteration counts),
 *           after legacy and REX prefixes; DX read at execution.
 *   mmio    stores to memory-mapped I/O, by guest-physical address: a memory
 *           callback (writes) on every instruction of kernel blocks keeps the
 *           accesses qemu_plugin_hwaddr_is_io says are IO, counted by
 *           qemu_plugin_hwaddr_phys_addr (the absolute guest-physical
 *           address: xAPIC 0xfee00300 is ICR low, 0xfee000b0 EOI,
 *           0xfee00380 TMICT) with the MemoryRegion's name
 *           (qemu_plugin_hwaddr_device_name: apic-msi, virtio-pci-notify).
 * Interrupts taken are not counted here (QEMU 10.0's API has no
 * discontinuity callbacks): the entries of the kernel's IDT stubs in the
 * per-block counts give them. Under nested SVM a level-2 MMIO store faults
 * to the host (#NPF) before it is made, so it is not seen at level 2; port
 * I/O, HLT, CPUID and WRMSR are counted at level 2 when executed there (each
 * a #VMEXIT to the host's KVM). Instructions are decoded once, at
 * translation (blklab-decode.h; decode-test.c runs it on known
 * encodings); only the instructions that are these get a callback, and
 * only kernel blocks' instructions get the memory callback.
 * Plugin API version 1 (QEMU 7.2) has no register reads: the counting is
 * compiled out and the dump says "exits unavailable".
 *
 * Marks. With mark=ADDR each execution of the kernel block at ADDR copies
 * every would-be exit count, under the lock that guards them, as it is
 * then: the dump's "mark" records are the counts at the last mark, "marks"
 * how many marks there were. The lab gives the start of the guest's
 * arch_show_interrupts, which formats /proc/interrupts' per-CPU IPI and
 * timer lines: the counts at a mark are the plugin's at the instant the
 * guest read its own counters, so two marks bound the guest's own window.
 *
 * Tasks (plugin API version 4). Each count is also kept by the machine's
 * task that ran it, so that a nested lab can say which of its host's
 * threads cost what. The machine kernel's __switch_to(prev, next) is
 * given in the "tasks" command (the lab's host says where it is once it
 * runs, when its blocks are translated already: a new address resets the
 * plugin, so that QEMU translates every block again with the callbacks it
 * now needs); a
 * callback on the block there, run before the block's count, makes the
 * task_struct in RSI the vCPU's current task, and every count after it, the block's
 * own included, is that task's, until the vCPU's next switch. A task is
 * its task_struct's address and its pid; its tgid and name (comm) are
 * read from guest memory at each switch to it, once the lab has said
 * where they lie ("tasks" command: the offsets from the kernel's BTF);
 * before, pid and tgid are -1 and the name empty. What a vCPU ran before
 * its first switch is task 0's. A block cut short takes its instructions
 * back from the task it was charged to (the scoreboard keeps it).
 *
 * Halt. With halt=ADDR (the "tasks" command: KVM's kvm_vcpu_halt, which
 * polls for a wake-up and then sleeps when a guest's vCPU halts), a
 * callback on the block there reads the return address from the stack
 * and marks the current task as halting; its level-1 instructions count
 * as its `halt` too until it runs the block at that address (the
 * function returned). The mark stays with the task while it sleeps, so
 * the idle task's instructions are never halt, the vCPU thread's wake-up
 * is.
 *
 * Dump format (text, one record a line):
 *   blklab-insns 6
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
 *   cut C R                         (C block executions cut short, R
 *                                    instructions re-run alone and counted
 *                                    by their memory access; or "cut
 *                                    unavailable REASON": blocks cut short
 *                                    count whole)
 *   exits available                 (or "exits unavailable REASON": no
 *                                    exit records follow)
 *   exit L I KIND KEY N [NAME]      (would-be exits at level L (1|2) of
 *                                    vCPU I: KIND hlt or cpuid (KEY 0),
 *                                    wrmsr (KEY the MSR), in or out (KEY
 *                                    the port), mmio (KEY the guest-physical
 *                                    address, NAME the MemoryRegion's);
 *                                    KEY hex without 0x; only N > 0)
 *   marks M                         (with mark=: the marks so far)
 *   mark L I KIND KEY N [NAME]      (with mark=: an exit record's count at
 *                                    the last mark; only N > 0)
 *   tasks off                       (or "tasks switch ADDR halt ADDR names
 *                                    yes|no": ADDRs hex, halt 0 when not
 *                                    set; names: whether the offsets are)
 *   task PTR PID TGID kernel K user U l2kernel K2 l2user U2 halt H switches S comm NAME
 *                                   (per task with a count: PTR hex, 0 for
 *                                    what ran before a vCPU's first
 *                                    switch; PID, TGID -1 when unknown;
 *                                    NAME the rest of the line, maybe
 *                                    empty or with spaces; the tasks'
 *                                    counts add up to the vCPUs', but
 *                                    for what ran while the dump was
 *                                    being written)
 *   tb ADDR INSNS EXECS             (level 1 kernel blocks that ran; ADDR hex
 *                                    without 0x)
 *   tb2 ADDR INSNS EXECS            (level 2 kernel blocks that ran)
 *   end
 *
 * Format 5 is format 6 without the task records. Format 4 is format 5
 * without the cut record (blocks cut short count
 * whole). Format 3 is format 4 without the exit records.
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

#include "blklab-decode.h"

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

/* Would-be exits need register reads: plugin API version 2 (QEMU 9.0). */
#if QEMU_PLUGIN_VERSION >= 2
#define EXITS 1
#else
#define EXITS 0
#endif

/* Counting only what retired needs per-vCPU inline operations (a
 * scoreboard): plugin API version 2 (QEMU 9.0). Before, a block cut short
 * counts in full. */
#if QEMU_PLUGIN_VERSION >= 2
#define RETIRED 1
#else
#define RETIRED 0
#endif

/* Tasks need guest memory reads: plugin API version 4 (QEMU 10.0). */
#if QEMU_PLUGIN_VERSION >= 4
#define TASKS 1
#else
#define TASKS 0
#endif

/* retired=off: count whole blocks. Single-threaded TCG (-icount) with more
 * than one vCPU shares each translated block between the vCPUs, and QEMU
 * then bakes the translating vCPU's index into the block's per-vCPU
 * inline operations (plugin-gen.c's gen_cpu_index without CF_PARALLEL):
 * another vCPU running the block would store into the wrong entry (QEMU
 * 10.0 stored out of bounds and crashed). The lab passes it there. */
static bool retired_off;

/* Copy an instruction's bytes into buf (16 bytes); its size, 0 if it does
 * not fit. */
static size_t insn_bytes(const struct qemu_plugin_insn *insn, uint8_t *buf)
{
    size_t size = qemu_plugin_insn_size(insn);
    if (size > 16) {
        return 0;
    }
#if QEMU_PLUGIN_VERSION >= 3
    if (qemu_plugin_insn_data(insn, buf, 16) < size) {
        return 0;
    }
#else
    memcpy(buf, qemu_plugin_insn_data(insn), size);
#endif
    return size;
}

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

#if EXITS
static void find_registers(unsigned int vcpu_index);
#endif

static void vcpu_init(qemu_plugin_id_t id, unsigned int vcpu_index)
{
    note_vcpu(vcpu_index);
#if EXITS
    if (vcpu_index < MAX_VCPUS) {
        find_registers(vcpu_index);
    }
#endif
}

/* The user data of a translated block: its instruction count, the levels
 * it ran at (bit 0: level 1, bit 1: level 2), and for a kernel block the
 * counters of its start address (blocks starting at one address may differ
 * in length, e.g. after a retranslation, or be two blocks, one per level). */
typedef struct BlockCb {
    Block *block; /* NULL for a user block */
    uint64_t vaddr;
    uint64_t n;
    uint32_t levels;
    int32_t fixed; /* levels by address: the block's level index; else -1 */
    uint64_t start; /* what its callback stores in the vCPU's `started` */
    void *board;    /* the progress scoreboard's entry 0 when translated */
    bool last_mem;  /* its last instruction touches memory whenever it
                       finishes (always_accesses_memory) */
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

/* Tasks (see "Tasks" in the header comment). A task is known by its
 * task_struct's address and its pid (-1 until the offsets are set): a
 * task_struct freed and reused is another task. */
typedef struct {
    uint64_t ptr;
    int64_t pid;
} TaskKey;

typedef struct {
    TaskKey k;
    int64_t tgid;
    char comm[17];
    uint64_t kernel[LEVELS], user[LEVELS];
    uint64_t halt;     /* level-1 instructions while in the halt function */
    uint64_t switches; /* times switched in */
    uint64_t halt_ret; /* while in the halt function: its return address */
} Task;

static uint64_t switch_addr; /* 0: no task tracking */
static uint64_t halt_addr;   /* 0: no halt accounting */
static int64_t off_comm = -1, off_pid = -1, off_tgid = -1;
static GHashTable *tasks;    /* TaskKey -> Task*, guarded by `lock` */
static Task no_task;         /* what ran before a vCPU's first switch */
/* The vCPU's current task: written by its own thread, read by the dump. */
static Task *cur_task[MAX_VCPUS];

static guint task_hash(gconstpointer p)
{
    const TaskKey *k = p;
    return g_int64_hash(&k->ptr) ^ (guint)(k->pid * 0x9e3779b1u);
}

static gboolean task_equal(gconstpointer a, gconstpointer b)
{
    const TaskKey *x = a, *y = b;
    return x->ptr == y->ptr && x->pid == y->pid;
}

/* A task's counters, by the vCPU's current task or what a block was
 * charged to: the low bit of the word says the block counted as halt. */
#define TASK_HALT 1ULL
static inline Task *task_of(uint64_t word)
{
    return (Task *)(uintptr_t)(word & ~TASK_HALT);
}

static inline void add_task(uint64_t word, const BlockCb *b, uint64_t lvl, uint64_t insns)
{
    Task *t = task_of(word);
    if (!t) {
        return;
    }
    __atomic_fetch_add(b->block ? &t->kernel[lvl] : &t->user[lvl], insns, __ATOMIC_RELAXED);
    if (word & TASK_HALT) {
        __atomic_fetch_add(&t->halt, insns, __ATOMIC_RELAXED);
    }
}

/* Add `insns` instructions and `execs` executions of block `b` at level
 * index `lvl` (negative values take back what was added). */
static inline void add_counts(VcpuCount *v, const BlockCb *b, uint64_t lvl, uint64_t insns,
                              uint64_t execs, uint64_t task)
{
    add_task(task, b, lvl, insns);
    if (b->block) {
        __atomic_fetch_add(&b->block->insns[lvl], insns, __ATOMIC_RELAXED);
        __atomic_fetch_add(&b->block->execs[lvl], execs, __ATOMIC_RELAXED);
        __atomic_store_n(&v->kernel[lvl], v->kernel[lvl] + insns, __ATOMIC_RELAXED);
    } else {
        __atomic_store_n(&v->user[lvl], v->user[lvl] + insns, __ATOMIC_RELAXED);
    }
}

#if RETIRED
/* Where each vCPU got in the block it entered last (see "Retired
 * instructions" in the header comment). A scoreboard entry: the inline
 * operations write `started` and `rerun`, the vCPU's block callback the
 * rest; the dump reads it under `seq`. */
typedef struct {
    uint64_t started; /* the 1-based index of the last instruction started
                         that may stop the block; its length once none
                         may; one more once a last instruction that
                         always touches memory has */
    uint64_t rerun;   /* the BlockCb of a 1-instruction block that accessed
                         memory, or 0 */
    uint64_t cur;     /* the BlockCb of the block entered last, or 0 */
    uint64_t lvl;     /* the level index `cur` was counted at */
    uint64_t seq;     /* odd while the vCPU's callback changes the counts */
    uint64_t cut;     /* block executions cut short */
    uint64_t reruns;  /* instructions run without execution callbacks */
    uint64_t task;    /* the task word `cur` was charged to (task_word) */
} Progress;
_Static_assert(sizeof(Progress) == 64, "one cache line per vCPU");

static struct qemu_plugin_scoreboard *progress;

/* What the vCPU's last block and a rerun since then still owe the counts:
 * `undo` instructions (and `undo_execs` executions) of `cut` at `cut_lvl`
 * that did not retire, and one execution of `rerun` (NULL if none) at
 * `rerun_lvl`. */
typedef struct {
    const BlockCb *cut;
    uint64_t cut_lvl, undo, undo_execs;
    const BlockCb *rerun;
    uint64_t rerun_lvl;
    uint64_t task; /* both ran as the task `cur` was charged to */
} Pending;

static inline Pending pending(const Progress *p)
{
    Pending d = {.task = p->task};
    const BlockCb *cur = (const BlockCb *)(uintptr_t)p->cur;
    const BlockCb *rerun = (const BlockCb *)(uintptr_t)p->rerun;
    bool cut = cur && p->started < cur->n;
    if (cur && !cut && cur->last_mem) {
        /* Its last instruction started but did not touch memory: it
         * stopped the block. A 1-instruction block says it touched memory
         * in `rerun`. */
        cut = cur->n == 1 ? rerun != cur : p->started == cur->n;
    }
    if (cut) {
        /* The instruction started last stopped the block: it retired only
         * if it runs again, counted by what runs it then. */
        d.cut = cur;
        d.cut_lvl = p->lvl;
        d.undo = cur->n - (p->started - 1);
        d.undo_execs = p->started == 1; /* nothing of it retired */
    }
    if (rerun && rerun != cur) {
        /* A block whose execution callbacks QEMU left out (the instruction
         * it re-runs after restarting a block at a device access): its
         * memory access says it ran. It continues `cur`'s level. */
        d.rerun = rerun;
        d.rerun_lvl = rerun->fixed >= 0 ? (uint64_t)rerun->fixed : p->lvl;
    }
    return d;
}

static inline void settle(VcpuCount *v, Progress *p)
{
    Pending d = pending(p);
    if (d.cut) {
        add_counts(v, d.cut, d.cut_lvl, -d.undo, -d.undo_execs, d.task);
        p->cut++;
    }
    if (d.rerun) {
        add_counts(v, d.rerun, d.rerun_lvl, d.rerun->n, 1, d.task);
        p->reruns++;
    }
    p->rerun = 0;
}

/* A sequence lock: the dump retries its read of a vCPU's counts while
 * `seq` is odd or changed under it (on x86 hosts these are compiler
 * barriers only). */
static inline void seq_begin(Progress *p)
{
    __atomic_store_n(&p->seq, p->seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
}

static inline void seq_end(Progress *p)
{
    __atomic_store_n(&p->seq, p->seq + 1, __ATOMIC_RELEASE);
}
#endif

/* The task word a block at level index `lvl` is charged to on vCPU
 * `vcpu_index`: its current task, marked halt while that task is in the
 * halt function (until it runs the block at the return address); 0
 * without task tracking. */
static inline uint64_t task_word(unsigned int vcpu_index, const BlockCb *b, uint64_t lvl)
{
    if (!switch_addr) {
        return 0;
    }
    Task *t = cur_task[vcpu_index];
    if (!t) {
        return (uintptr_t)&no_task;
    }
    uint64_t word = (uintptr_t)t;
    uint64_t ret = __atomic_load_n(&t->halt_ret, __ATOMIC_RELAXED);
    if (lvl == 0 && ret) {
        if (b->vaddr == ret) {
            __atomic_store_n(&t->halt_ret, 0, __ATOMIC_RELAXED);
        } else {
            word |= TASK_HALT;
        }
    }
    return word;
}

static inline void count(unsigned int vcpu_index, VcpuCount *v, BlockCb *b)
{
#if RETIRED
    /* Where this block's inline operations store: QEMU flushes every
     * block when it moves a scoreboard (a vCPU added), so it is where they
     * were translated to, and no call is needed to find it. */
    Progress *p = retired_off ? NULL : (Progress *)b->board + vcpu_index;
    if (p) {
        seq_begin(p);
        settle(v, p);
    }
#endif
    uint64_t lvl = v->level;
    note_level(b, lvl);
    if (b->fixed >= 0) {
        v->disagree += (uint64_t)b->fixed != lvl;
        lvl = (uint64_t)b->fixed;
    }
    /* All of it, taken back at the next block if it stops partway. */
    uint64_t task = task_word(vcpu_index, b, lvl);
    add_counts(v, b, lvl, b->n, 1, task);
#if RETIRED
    if (p) {
        p->cur = (uintptr_t)b;
        p->lvl = lvl;
        p->task = task;
        p->started = b->start;
        seq_end(p);
    }
#endif
}

static qemu_plugin_id_t plugin_id;
static void register_callbacks(qemu_plugin_id_t id);

/* A reset the control thread asked for (set_tasks), made by the next vCPU
 * to run a block: QEMU flushes the translated blocks only for a reset
 * asked on a vCPU's thread (off one it just swaps the callbacks, and the
 * blocks translated before keep theirs). */
static int reset_pending;

static inline void reset_if_asked(void)
{
    if (__atomic_load_n(&reset_pending, __ATOMIC_RELAXED) &&
        __atomic_exchange_n(&reset_pending, 0, __ATOMIC_ACQ_REL)) {
        qemu_plugin_reset(plugin_id, register_callbacks);
    }
}

static void block_exec(unsigned int vcpu_index, void *udata)
{
    reset_if_asked();
    if (vcpu_index < MAX_VCPUS) {
        count(vcpu_index, &vcpus[vcpu_index], udata);
    }
}

#if EXITS
/* Would-be exits (see the header comment). */
static const char *const ev_names[EV_KINDS] = {"hlt", "cpuid", "wrmsr", "in", "out", "mmio"};

typedef struct {
    uint64_t key;   /* MSR, port, guest-physical address; 0 for hlt, cpuid */
    uint32_t vcpu;
    uint8_t kind;
    uint8_t level;  /* level index: 0 or 1 */
    uint16_t pad;
} EvKey;

typedef struct {
    EvKey k;
    const char *name; /* mmio: the MemoryRegion's name */
    uint64_t count;
    uint64_t marked;  /* count at the last mark */
} Event;

static GHashTable *events; /* EvKey -> Event*, guarded by `lock` */

static guint ev_hash(gconstpointer p)
{
    const EvKey *k = p;
    return g_int64_hash(&k->key) ^ (k->vcpu * 0x9e3779b1u) ^ ((guint)k->kind << 24) ^
           ((guint)k->level << 28);
}

static gboolean ev_equal(gconstpointer a, gconstpointer b)
{
    const EvKey *x = a, *y = b;
    return x->key == y->key && x->vcpu == y->vcpu && x->kind == y->kind &&
           x->level == y->level;
}

static void bump(uint8_t kind, uint64_t lvl, unsigned int vcpu, uint64_t key, const char *name)
{
    EvKey k = {.key = key, .vcpu = vcpu, .kind = kind, .level = (uint8_t)lvl};
    g_mutex_lock(&lock);
    Event *e = g_hash_table_lookup(events, &k);
    if (!e) {
        e = g_new0(Event, 1);
        e->k = k;
        e->name = name;
        g_hash_table_insert(events, &e->k, e);
    }
    e->count++;
    g_mutex_unlock(&lock);
}

/* Marks (see the header comment). */
static uint64_t mark_addr; /* 0: no marks */
static uint64_t marks;     /* guarded by `lock` */

static void mark_exec(unsigned int vcpu_index, void *udata)
{
    GHashTableIter it;
    gpointer key, value;
    g_mutex_lock(&lock);
    g_hash_table_iter_init(&it, events);
    while (g_hash_table_iter_next(&it, &key, &value)) {
        Event *e = value;
        e->marked = e->count;
    }
    marks++;
    g_mutex_unlock(&lock);
}

static void register_mark(struct qemu_plugin_tb *tb, uint64_t vaddr)
{
    if (mark_addr && vaddr == mark_addr) {
        qemu_plugin_register_vcpu_tb_exec_cb(tb, mark_exec, QEMU_PLUGIN_CB_NO_REGS, NULL);
    }
}

/* One `exit` or `mark` record: `tag L I KIND KEY N [NAME]`, N = `n`. */
static void write_event(FILE *f, const char *tag, const Event *e, uint64_t n)
{
    fprintf(f, "%s %d %u %s %" PRIx64 " %" PRIu64 "%s%s\n", tag, e->k.level + 1, e->k.vcpu,
            ev_names[e->k.kind], e->k.key, n, e->name ? " " : "", e->name ? e->name : "");
}

/* The marks and the counts at the last one; `lock` held. */
static void write_marks(FILE *f)
{
    if (!mark_addr) {
        return;
    }
    fprintf(f, "marks %" PRIu64 "\n", marks);
    GHashTableIter it;
    gpointer key, value;
    g_hash_table_iter_init(&it, events);
    while (g_hash_table_iter_next(&it, &key, &value)) {
        Event *e = value;
        if (e->marked) {
            write_event(f, "mark", e, e->marked);
        }
    }
}

/* An instruction that would exit: what it is, decoded at translation. */
typedef struct {
    struct BlockCb *block;
    uint8_t kind;
    bool dx;       /* the port is DX (else `port`) */
    uint16_t port; /* the imm8 port */
} ExitInsn;

/* The level index an exit of block `b` counts at. */
static inline uint64_t exit_level(unsigned int vcpu_index, const BlockCb *b)
{
    return b->fixed >= 0 ? (uint64_t)b->fixed : vcpus[vcpu_index].level;
}

/* Per vCPU: the handles of RCX and RDX (qemu_plugin_get_registers), and
 * of RSP and RSI for the tasks. */
static struct qemu_plugin_register *reg_rcx[MAX_VCPUS], *reg_rdx[MAX_VCPUS];
static struct qemu_plugin_register *reg_rsp[MAX_VCPUS], *reg_rsi[MAX_VCPUS];
static __thread GByteArray *reg_buf;

static void find_registers(unsigned int vcpu_index)
{
    GArray *regs = qemu_plugin_get_registers();
    for (guint i = 0; regs && i < regs->len; i++) {
        qemu_plugin_reg_descriptor *r = &g_array_index(regs, qemu_plugin_reg_descriptor, i);
        if (!strcmp(r->name, "rcx") || (!reg_rcx[vcpu_index] && !strcmp(r->name, "ecx"))) {
            reg_rcx[vcpu_index] = r->handle;
        } else if (!strcmp(r->name, "rdx") || (!reg_rdx[vcpu_index] && !strcmp(r->name, "edx"))) {
            reg_rdx[vcpu_index] = r->handle;
        } else if (!strcmp(r->name, "rsp")) {
            reg_rsp[vcpu_index] = r->handle;
        } else if (!strcmp(r->name, "rsi")) {
            reg_rsi[vcpu_index] = r->handle;
        }
    }
    if (regs) {
        g_array_free(regs, true);
    }
    if (!reg_rcx[vcpu_index] || !reg_rdx[vcpu_index]) {
        fprintf(stderr, "blklab-insns: vCPU %u has no rcx/rdx register to read\n", vcpu_index);
    }
}

/* The low `size` bytes of a register (little-endian target, at most 8) in
 * *v; false when unreadable. */
static bool read_reg(struct qemu_plugin_register *h, size_t size, uint64_t *v)
{
    if (!h) {
        return false;
    }
    if (!reg_buf) {
        reg_buf = g_byte_array_sized_new(16);
    }
    g_byte_array_set_size(reg_buf, 0);
    int n = qemu_plugin_read_register(h, reg_buf);
    if (n < (int)size) {
        return false;
    }
    *v = 0;
    for (size_t i = 0; i < size; i++) {
        *v |= (uint64_t)reg_buf->data[i] << (8 * i);
    }
    return true;
}

/* The low 32 bits of a register; ~0 when unreadable. */
static uint64_t read_low32(struct qemu_plugin_register *h)
{
    uint64_t v;
    return read_reg(h, 4, &v) ? v : ~(uint64_t)0;
}

#if TASKS
/* A 64-bit register; 0 when unreadable. */
static uint64_t read_reg64(struct qemu_plugin_register *h)
{
    uint64_t v;
    return read_reg(h, 8, &v) ? v : 0;
}

static __thread GByteArray *mem_buf;

/* `len` bytes of guest memory at virtual address `addr` into `out`, as
 * the vCPU sees it now. */
static bool read_guest(uint64_t addr, void *out, size_t len)
{
    if (!mem_buf) {
        mem_buf = g_byte_array_sized_new(32);
    }
    g_byte_array_set_size(mem_buf, 0);
    if (!qemu_plugin_read_memory_vaddr(addr, mem_buf, len) || mem_buf->len < len) {
        return false;
    }
    memcpy(out, mem_buf->data, len);
    return true;
}

/* A 32-bit signed field of the task_struct at `ptr`; -1 unknown. */
static int64_t task_field(uint64_t ptr, int64_t off)
{
    int32_t v;
    if (off < 0 || !read_guest(ptr + (uint64_t)off, &v, sizeof(v))) {
        return -1;
    }
    return v;
}

/* __switch_to(prev, next): the task_struct in RSI becomes the vCPU's
 * current task (before the block's own count, which is next's). */
static void switch_exec(unsigned int vcpu_index, void *udata)
{
    if (vcpu_index >= MAX_VCPUS) {
        return;
    }
    uint64_t ptr = read_reg64(reg_rsi[vcpu_index]);
    if (ptr < KERNEL_START) {
        return;
    }
    int64_t o_pid = __atomic_load_n(&off_pid, __ATOMIC_ACQUIRE);
    TaskKey k = {.ptr = ptr, .pid = task_field(ptr, o_pid)};
    int64_t tgid = task_field(ptr, __atomic_load_n(&off_tgid, __ATOMIC_RELAXED));
    char comm[17] = {0};
    int64_t o_comm = __atomic_load_n(&off_comm, __ATOMIC_RELAXED);
    bool named = o_comm >= 0 && read_guest(ptr + (uint64_t)o_comm, comm, 16);
    g_mutex_lock(&lock);
    Task *t = g_hash_table_lookup(tasks, &k);
    if (!t) {
        t = g_new0(Task, 1);
        t->k = k;
        g_hash_table_insert(tasks, &t->k, t);
    }
    t->tgid = tgid;
    if (named) {
        /* A thread renames itself (prctl): the name it runs under now. */
        memcpy(t->comm, comm, 16);
    }
    t->switches++;
    g_mutex_unlock(&lock);
    __atomic_store_n(&cur_task[vcpu_index], t, __ATOMIC_RELEASE);
}

/* The halt function's entry: its return address, on the stack, ends the
 * task's halt (task_word). */
static void halt_exec(unsigned int vcpu_index, void *udata)
{
    if (vcpu_index >= MAX_VCPUS || !cur_task[vcpu_index]) {
        return;
    }
    uint64_t ret;
    if (read_guest(read_reg64(reg_rsp[vcpu_index]), &ret, sizeof(ret)) && ret >= KERNEL_START) {
        __atomic_store_n(&cur_task[vcpu_index]->halt_ret, ret, __ATOMIC_RELAXED);
    }
}

/* The switch and halt callbacks of a kernel block at `vaddr`, before its
 * counting callback. */
static void register_tasks(struct qemu_plugin_tb *tb, uint64_t vaddr)
{
    if (switch_addr && vaddr == switch_addr) {
        qemu_plugin_register_vcpu_tb_exec_cb(tb, switch_exec, QEMU_PLUGIN_CB_R_REGS, NULL);
    }
    uint64_t halt = __atomic_load_n(&halt_addr, __ATOMIC_ACQUIRE);
    if (halt && vaddr == halt) {
        qemu_plugin_register_vcpu_tb_exec_cb(tb, halt_exec, QEMU_PLUGIN_CB_R_REGS, NULL);
    }
}
#endif

static void exit_exec(unsigned int vcpu_index, void *udata)
{
    ExitInsn *x = udata;
    if (vcpu_index >= MAX_VCPUS) {
        return;
    }
    uint64_t lvl = exit_level(vcpu_index, x->block);
    uint64_t key = 0;
    switch (x->kind) {
    case EV_WRMSR:
        key = read_low32(reg_rcx[vcpu_index]);
        break;
    case EV_IN:
    case EV_OUT:
        key = x->dx ? read_low32(reg_rdx[vcpu_index]) & 0xffff : x->port;
        break;
    }
    bump(x->kind, lvl, vcpu_index, key, NULL);
}

/* MMIO stores are looked up only once the lab has taken its first dump
 * (the first window's begin; from the start without ctl=). Looking up a
 * store's address (qemu_plugin_get_hwaddr) resolves its TLB entry against
 * QEMU's current memory map; when that map changed under the entry (PCI
 * enumeration and device enabling at boot rebuild it, the store itself
 * may be the config write that did), QEMU 10.0 aborts in iotlb_to_section
 * (the assertion of QEMU issue 1921). The lab takes its first dump when
 * the guest has booted, before any window and any mark that opens one,
 * so no window loses a count. */
static int mmio_armed;

static void store_exec(unsigned int vcpu_index, qemu_plugin_meminfo_t info,
                       uint64_t vaddr, void *udata)
{
    if (!__atomic_load_n(&mmio_armed, __ATOMIC_ACQUIRE)) {
        return;
    }
    struct qemu_plugin_hwaddr *h = qemu_plugin_get_hwaddr(info, vaddr);
    if (!h || !qemu_plugin_hwaddr_is_io(h) || vcpu_index >= MAX_VCPUS) {
        return;
    }
    bump(EV_MMIO, exit_level(vcpu_index, udata), vcpu_index,
         qemu_plugin_hwaddr_phys_addr(h), qemu_plugin_hwaddr_device_name(h));
}

/* Callbacks on the instructions of a translated block that would exit,
 * and on kernel blocks (`kernel`) a store callback on each instruction. */
static void register_exits(struct qemu_plugin_tb *tb, size_t n, BlockCb *b, bool kernel)
{
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        uint8_t buf[16];
        size_t size = insn_bytes(insn, buf);
        bool dx;
        uint16_t port;
        int kind = exit_kind(buf, size, &dx, &port);
        if (kind >= 0) {
            ExitInsn *x = g_new0(ExitInsn, 1);
            *x = (ExitInsn){.block = b, .kind = (uint8_t)kind, .dx = dx, .port = port};
            bool regs = kind == EV_WRMSR || (dx && (kind == EV_IN || kind == EV_OUT));
            qemu_plugin_register_vcpu_insn_exec_cb(
                insn, exit_exec, regs ? QEMU_PLUGIN_CB_R_REGS : QEMU_PLUGIN_CB_NO_REGS, x);
        }
        if (kernel) {
            qemu_plugin_register_vcpu_mem_cb(insn, store_exec, QEMU_PLUGIN_CB_NO_REGS,
                                             QEMU_PLUGIN_MEM_W, b);
        }
    }
}
#endif

/* A return block: the host resumes here after #VMEXIT. */
static void return_exec(unsigned int vcpu_index, void *udata)
{
    if (vcpu_index < MAX_VCPUS) {
        VcpuCount *v = &vcpus[vcpu_index];
        v->level = 0;
        v->returns++;
        count(vcpu_index, v, udata);
    }
}

static void vmrun_exec(unsigned int vcpu_index, void *udata)
{
    if (vcpu_index < MAX_VCPUS) {
        vcpus[vcpu_index].level = 1;
        vcpus[vcpu_index].vmruns++;
    }
}

static bool is_vmrun(const struct qemu_plugin_insn *insn)
{
    uint8_t buf[16];
    return decode_vmrun(buf, insn_bytes(insn, buf));
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

#if RETIRED
/* The inline operations that say how far a block got. Only an instruction
 * that may stop its block (may_stop_block: it touches memory or calls a
 * helper that can fault) needs one: instruction i (0-based) stores i + 1
 * in the vCPU's `started` before it runs; for instruction 0 the block's
 * callback does. The first instruction after the last that may stop the
 * block stores n (the block finishes from there), and so does the
 * callback of a block none of whose instructions may stop it. A
 * 1-instruction block also stores its BlockCb in `rerun` at each memory
 * access: QEMU re-runs an instruction that touched a device partway
 * through a block as a block of its own without execution callbacks, and
 * that store is how it is counted. Not a REP string instruction: it always
 * ends its block, so QEMU never re-runs it so, and it may access memory
 * 65536 times in one execution. */
static void register_progress(struct qemu_plugin_tb *tb, size_t n, BlockCb *b)
{
    qemu_plugin_u64 started = qemu_plugin_scoreboard_u64_in_struct(progress, Progress, started);
    if (!n) {
        return;
    }
    b->board = qemu_plugin_scoreboard_find(progress, 0);
    size_t last = n; /* the last instruction that may stop the block; n: none */
    b->start = n;
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        uint8_t buf[16];
        size_t size = insn_bytes(insn, buf);
        if (size && !may_stop_block(buf, size)) {
            continue;
        }
        if (i) {
            qemu_plugin_register_vcpu_insn_exec_inline_per_vcpu(
                insn, QEMU_PLUGIN_INLINE_STORE_U64, started, i + 1);
        } else {
            b->start = 1;
        }
        last = i;
    }
    if (last < n - 1) {
        qemu_plugin_register_vcpu_insn_exec_inline_per_vcpu(
            qemu_plugin_tb_get_insn(tb, last + 1), QEMU_PLUGIN_INLINE_STORE_U64, started, n);
    }
    /* A last instruction that always touches memory says when it has
     * (memory operations run after the access): a fault it raises stops
     * the block before. One of a 1-instruction block says so in `rerun`
     * (below), as `started` is the cut block's when QEMU re-runs one. */
    struct qemu_plugin_insn *last_insn = qemu_plugin_tb_get_insn(tb, n - 1);
    uint8_t lbuf[16];
    b->last_mem = always_accesses_memory(lbuf, insn_bytes(last_insn, lbuf));
    if (b->last_mem && n > 1) {
        qemu_plugin_register_vcpu_mem_inline_per_vcpu(last_insn, QEMU_PLUGIN_MEM_RW,
                                                      QEMU_PLUGIN_INLINE_STORE_U64, started,
                                                      n + 1);
    }
    uint8_t buf[16];
    if (n == 1 && !is_rep_string(buf, insn_bytes(qemu_plugin_tb_get_insn(tb, 0), buf))) {
        qemu_plugin_register_vcpu_mem_inline_per_vcpu(
            qemu_plugin_tb_get_insn(tb, 0), QEMU_PLUGIN_MEM_RW, QEMU_PLUGIN_INLINE_STORE_U64,
            qemu_plugin_scoreboard_u64_in_struct(progress, Progress, rerun), (uintptr_t)b);
    }
}
#endif

static void tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    uint64_t vaddr = qemu_plugin_tb_vaddr(tb);
    size_t n = qemu_plugin_tb_n_insns(tb);
    /* Lives as long as QEMU: a TB may be retranslated, never freed here. */
    BlockCb *b = g_new0(BlockCb, 1);
    b->vaddr = vaddr;
    b->n = n;
    b->fixed = fixed_level(tb, n);
    if (vaddr < KERNEL_START) {
        /* VMRUN needs CPL 0, and so does the block it returns to. */
        qemu_plugin_register_vcpu_tb_exec_cb(tb, block_exec,
                                             QEMU_PLUGIN_CB_NO_REGS, b);
#if RETIRED
        if (!retired_off) {
            register_progress(tb, n, b);
        }
#endif
#if EXITS
        register_exits(tb, n, b, false);
#endif
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
#if TASKS
    register_tasks(tb, vaddr);
#endif
    qemu_plugin_register_vcpu_tb_exec_cb(tb, ret ? return_exec : block_exec,
                                         QEMU_PLUGIN_CB_NO_REGS, b);
#if RETIRED
    if (!retired_off) {
        register_progress(tb, n, b);
    }
#endif
    if (vmrun) {
        /* VMRUN ends its block (QEMU: DISAS_NORETURN), so it is the last. */
        qemu_plugin_register_vcpu_insn_exec_cb(last, vmrun_exec,
                                               QEMU_PLUGIN_CB_NO_REGS, NULL);
    }
#if EXITS
    register_exits(tb, n, b, true);
    register_mark(tb, vaddr);
#endif
}

/* What a dump adds to a block's counters: the vCPUs' pending corrections
 * (Pending), by level index. */
typedef struct {
    uint64_t insns[LEVELS];
    uint64_t execs[LEVELS];
} Owed;

/* One vCPU's counts for a dump, its pending corrections applied (to
 * `owed` for the blocks). */
typedef struct {
    uint64_t kernel[LEVELS], user[LEVELS];
    uint64_t vmruns, returns, disagree, cut, reruns;
} VcpuTotals;

/* What a dump adds to a task's counters: the vCPUs' pending corrections. */
typedef struct {
    uint64_t kernel[LEVELS], user[LEVELS];
    uint64_t halt;
} TaskOwed;

#if RETIRED
/* Owe `insns` of block `b` to the task of `word` (task_word). */
static void owe_task(GHashTable *owed, uint64_t word, const BlockCb *b, uint64_t lvl,
                     uint64_t insns)
{
    Task *task = task_of(word);
    if (!task) {
        return;
    }
    TaskOwed *o = g_hash_table_lookup(owed, task);
    if (!o) {
        o = g_new0(TaskOwed, 1);
        g_hash_table_insert(owed, task, o);
    }
    *(b->block ? &o->kernel[lvl] : &o->user[lvl]) += insns;
    if (word & TASK_HALT) {
        o->halt += insns;
    }
}

static void owe(GHashTable *owed, VcpuTotals *t, const BlockCb *b, uint64_t lvl, uint64_t insns,
                uint64_t execs)
{
    if (b->block) {
        Owed *o = g_hash_table_lookup(owed, b->block);
        if (!o) {
            o = g_new0(Owed, 1);
            g_hash_table_insert(owed, b->block, o);
        }
        o->insns[lvl] += insns;
        o->execs[lvl] += execs;
        t->kernel[lvl] += insns;
    } else {
        t->user[lvl] += insns;
    }
}
#endif

/* vCPU i's counts, read consistently with its callback (RETIRED: under its
 * sequence lock, then settled as its next block would: into `owed` for
 * the blocks, `task_owed` for the tasks). */
static VcpuTotals read_vcpu(int i, GHashTable *owed, GHashTable *task_owed)
{
    VcpuCount *v = &vcpus[i];
    VcpuTotals t;
#if RETIRED
    Progress *p = retired_off ? NULL : qemu_plugin_scoreboard_find(progress, i);
    for (int tries = 0;; tries++) {
        uint64_t s1 = p ? __atomic_load_n(&p->seq, __ATOMIC_ACQUIRE) : 0;
#endif
        for (int l = 0; l < LEVELS; l++) {
            t.kernel[l] = __atomic_load_n(&v->kernel[l], __ATOMIC_RELAXED);
            t.user[l] = __atomic_load_n(&v->user[l], __ATOMIC_RELAXED);
        }
        t.vmruns = __atomic_load_n(&v->vmruns, __ATOMIC_RELAXED);
        t.returns = __atomic_load_n(&v->returns, __ATOMIC_RELAXED);
        t.disagree = __atomic_load_n(&v->disagree, __ATOMIC_RELAXED);
        t.cut = t.reruns = 0;
#if RETIRED
        if (!p) {
            break;
        }
        Progress q;
        q.started = __atomic_load_n(&p->started, __ATOMIC_RELAXED);
        q.rerun = __atomic_load_n(&p->rerun, __ATOMIC_RELAXED);
        q.cur = __atomic_load_n(&p->cur, __ATOMIC_RELAXED);
        q.lvl = __atomic_load_n(&p->lvl, __ATOMIC_RELAXED);
        q.task = __atomic_load_n(&p->task, __ATOMIC_RELAXED);
        t.cut = __atomic_load_n(&p->cut, __ATOMIC_RELAXED);
        t.reruns = __atomic_load_n(&p->reruns, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (!(s1 & 1) && __atomic_load_n(&p->seq, __ATOMIC_RELAXED) == s1) {
            Pending d = pending(&q);
            if (d.cut) {
                owe(owed, &t, d.cut, d.cut_lvl, -d.undo, -d.undo_execs);
                owe_task(task_owed, d.task, d.cut, d.cut_lvl, -d.undo);
            }
            if (d.rerun) {
                owe(owed, &t, d.rerun, d.rerun_lvl, d.rerun->n, 1);
                owe_task(task_owed, d.task, d.rerun, d.rerun_lvl, d.rerun->n);
            }
            break;
        }
        if (tries == 1000000) {
            /* A vCPU that never let go: its block in flight counts whole. */
            break;
        }
    }
#endif
    return t;
}

static void write_blocks(FILE *f, const char *tag, int lvl, GHashTable *owed)
{
    GHashTableIter it;
    gpointer key, value;
    g_hash_table_iter_init(&it, blocks);
    while (g_hash_table_iter_next(&it, &key, &value)) {
        Block *b = value;
        uint64_t insns = __atomic_load_n(&b->insns[lvl], __ATOMIC_RELAXED);
        uint64_t execs = __atomic_load_n(&b->execs[lvl], __ATOMIC_RELAXED);
        Owed *o = g_hash_table_lookup(owed, b);
        if (o) {
            insns += o->insns[lvl];
            execs += o->execs[lvl];
        }
        if (execs) {
            fprintf(f, "%s %" PRIx64 " %" PRIu64 " %" PRIu64 "\n", tag,
                    b->vaddr, insns, execs);
        }
    }
}

/* One `task` record, its pending corrections added. */
static void write_task(FILE *f, const Task *t, GHashTable *owed)
{
    TaskOwed o = {0};
    TaskOwed *po = g_hash_table_lookup(owed, t);
    if (po) {
        o = *po;
    }
    uint64_t k[LEVELS], u[LEVELS];
    uint64_t any = 0;
    for (int l = 0; l < LEVELS; l++) {
        k[l] = __atomic_load_n(&t->kernel[l], __ATOMIC_RELAXED) + o.kernel[l];
        u[l] = __atomic_load_n(&t->user[l], __ATOMIC_RELAXED) + o.user[l];
        any |= k[l] | u[l];
    }
    if (!any) {
        return;
    }
    uint64_t halt = __atomic_load_n(&t->halt, __ATOMIC_RELAXED) + o.halt;
    fprintf(f,
            "task %" PRIx64 " %" PRId64 " %" PRId64 " kernel %" PRIu64 " user %" PRIu64
            " l2kernel %" PRIu64 " l2user %" PRIu64 " halt %" PRIu64 " switches %" PRIu64
            " comm %s\n",
            t->k.ptr, t->k.pid, t->tgid, k[0], u[0], k[1], u[1], halt, t->switches, t->comm);
}

/* The tasks record and a `task` record per task that ran; `lock` held. */
static void write_tasks(FILE *f, GHashTable *owed)
{
    if (!switch_addr) {
        fprintf(f, "tasks off\n");
        return;
    }
    fprintf(f, "tasks switch %" PRIx64 " halt %" PRIx64 " names %s\n", switch_addr,
            __atomic_load_n(&halt_addr, __ATOMIC_RELAXED),
            __atomic_load_n(&off_comm, __ATOMIC_RELAXED) >= 0 ? "yes" : "no");
    write_task(f, &no_task, owed);
    GHashTableIter it;
    gpointer key, value;
    g_hash_table_iter_init(&it, tasks);
    while (g_hash_table_iter_next(&it, &key, &value)) {
        write_task(f, value, owed);
    }
}

static void write_exits(FILE *f)
{
#if EXITS
    fprintf(f, "exits available\n");
    GHashTableIter it;
    gpointer key, value;
    g_mutex_lock(&lock);
    g_hash_table_iter_init(&it, events);
    while (g_hash_table_iter_next(&it, &key, &value)) {
        Event *e = value;
        if (e->count) {
            write_event(f, "exit", e, e->count);
        }
    }
    write_marks(f);
    g_mutex_unlock(&lock);
#else
    fprintf(f, "exits unavailable plugin API version %d (QEMU before 9.0) cannot read "
               "registers\n", QEMU_PLUGIN_VERSION);
#endif
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
    fprintf(f, "blklab-insns 6\nlevels %s\nvcpus %d\n",
            l2ram_path ? "address" : "vmrun", n);
    GHashTable *owed = g_hash_table_new_full(g_direct_hash, g_direct_equal, NULL, g_free);
    GHashTable *task_owed = g_hash_table_new_full(g_direct_hash, g_direct_equal, NULL, g_free);
    uint64_t disagree = 0, cut = 0, reruns = 0;
    for (int i = 0; i < n && i < MAX_VCPUS; i++) {
        VcpuTotals t = read_vcpu(i, owed, task_owed);
        fprintf(f,
                "vcpu %d kernel %" PRIu64 " user %" PRIu64 " l2kernel %" PRIu64
                " l2user %" PRIu64 " vmruns %" PRIu64 " returns %" PRIu64 "\n",
                i, t.kernel[0], t.user[0], t.kernel[1], t.user[1], t.vmruns, t.returns);
        disagree += t.disagree;
        cut += t.cut;
        reruns += t.reruns;
    }
    fprintf(f, "mixed %" PRIu64 "\n", __atomic_load_n(&mixed, __ATOMIC_RELAXED));
    fprintf(f, "disagree %" PRIu64 "\n", disagree);
#if RETIRED
    if (retired_off) {
        fprintf(f, "cut unavailable retired=off (single-threaded TCG with more than one vCPU "
                   "shares blocks between vCPUs): a block cut short counts in full\n");
    } else {
        fprintf(f, "cut %" PRIu64 " %" PRIu64 "\n", cut, reruns);
    }
#else
    fprintf(f, "cut unavailable plugin API version %d (QEMU before 9.0) has no per-vCPU "
               "inline operations: a block cut short counts in full\n", QEMU_PLUGIN_VERSION);
#endif
    write_exits(f);
    g_mutex_lock(&lock);
    write_tasks(f, task_owed);
    write_blocks(f, "tb", 0, owed);
    write_blocks(f, "tb2", 1, owed);
    g_mutex_unlock(&lock);
    g_hash_table_destroy(owed);
    g_hash_table_destroy(task_owed);
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

/* "tasks switch=ADDR comm=OFF pid=OFF tgid=OFF halt=ADDR" (offsets
 * decimal, addresses hex; each optional, switch but the first time):
 * where tasks switch, how to name them, and where the halt
 * function starts. A new switch or halt address takes effect through a
 * reset of the plugin (qemu_plugin_reset: QEMU flushes every translated
 * block, so the blocks there get their callbacks when translated again;
 * the counts are the plugin's and stay). 0 on success, else -1 with `err`
 * set. */
static int set_tasks(char *args, char *err, size_t errlen)
{
#if TASKS
    int64_t comm = -1, pid = -1, tgid = -1;
    uint64_t halt = 0, sw = switch_addr;
    char *save = NULL;
    for (char *w = strtok_r(args, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(w, '=');
        char *end = NULL;
        if (!eq) {
            snprintf(err, errlen, "bad word %s (want KEY=VALUE)", w);
            return -1;
        }
        *eq = 0;
        const char *v = eq + 1;
        if (!strcmp(w, "halt")) {
            halt = g_ascii_strtoull(v, &end, 16);
        } else if (!strcmp(w, "switch")) {
            sw = g_ascii_strtoull(v, &end, 16);
        } else {
            int64_t x = g_ascii_strtoll(v, &end, 10);
            int64_t *dst = !strcmp(w, "comm") ? &comm : !strcmp(w, "pid") ? &pid
                         : !strcmp(w, "tgid") ? &tgid : NULL;
            if (!dst || x < 0 || x > 65536) {
                snprintf(err, errlen, "bad %s=%s (want comm, pid, tgid offsets or halt)", w, v);
                return -1;
            }
            *dst = x;
        }
        if (!end || *end || end == v) {
            snprintf(err, errlen, "bad %s=%s", w, v);
            return -1;
        }
    }
    if (sw < KERNEL_START || (halt && halt < KERNEL_START)) {
        snprintf(err, errlen, "want kernel addresses for switch and halt");
        return -1;
    }
    __atomic_store_n(&off_comm, comm, __ATOMIC_RELEASE);
    __atomic_store_n(&off_tgid, tgid, __ATOMIC_RELEASE);
    __atomic_store_n(&off_pid, pid, __ATOMIC_RELEASE);
    bool moved = sw != switch_addr || halt != halt_addr;
    __atomic_store_n(&halt_addr, halt, __ATOMIC_RELEASE);
    __atomic_store_n(&switch_addr, sw, __ATOMIC_RELEASE);
    if (moved) {
        __atomic_store_n(&reset_pending, 1, __ATOMIC_RELEASE);
    }
    return 0;
#else
    snprintf(err, errlen, "plugin API version %d (QEMU before 10.0) cannot read guest memory",
             QEMU_PLUGIN_VERSION);
    return -1;
#endif
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
#if EXITS
                __atomic_store_n(&mmio_armed, 1, __ATOMIC_RELEASE);
#endif
                if (write_dump(buf + 5, err, sizeof(err)) == 0) {
                    char *ok = g_strdup_printf("ok %s\n", buf + 5);
                    reply(fd, ok);
                    g_free(ok);
                } else {
                    char *e = g_strdup_printf("error %s\n", err);
                    reply(fd, e);
                    g_free(e);
                }
            } else if (strncmp(buf, "tasks ", 6) == 0) {
                if (set_tasks(buf + 6, err, sizeof(err)) == 0) {
                    reply(fd, "ok tasks\n");
                } else {
                    char *e = g_strdup_printf("error %s\n", err);
                    reply(fd, e);
                    g_free(e);
                }
            } else if (strcmp(buf, "ping") == 0) {
                reply(fd, "pong\n");
            } else {
                reply(fd, "error unknown command (want: dump FILE, tasks ..., ping)\n");
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
        } else if (strcmp(argv[i], "retired=off") == 0) {
            retired_off = true;
#if EXITS
        } else if (strncmp(argv[i], "mark=", 5) == 0) {
            char *end;
            mark_addr = g_ascii_strtoull(argv[i] + 5, &end, 16);
            if (*end || !mark_addr) {
                fprintf(stderr, "blklab-insns: bad mark=%s (want a hex address)\n", argv[i] + 5);
                return -1;
            }
#endif
        } else {
            fprintf(stderr, "blklab-insns: unknown argument %s (want ctl=PATH, out=FILE, "
                    "l2ram=FILE, mark=ADDR, retired=off)\n", argv[i]);
            return -1;
        }
    }
#if RETIRED
    progress = qemu_plugin_scoreboard_new(sizeof(Progress));
#endif
    blocks = g_hash_table_new(g_int64_hash, g_int64_equal);
    tasks = g_hash_table_new(task_hash, task_equal);
    no_task.k.pid = -1;
    no_task.tgid = -1;
    ret_haddr = g_hash_table_new(g_direct_hash, g_direct_equal);
    ret_vaddr = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, NULL);
#if EXITS
    events = g_hash_table_new(ev_hash, ev_equal);
#endif
#if EXITS
    mmio_armed = ctl_path == NULL;
#endif
    if (ctl_path && start_ctl(ctl_path) != 0) {
        return -1;
    }
    plugin_id = id;
    register_callbacks(id);
    return 0;
}

/* The plugin's callbacks: at install, and again after a reset (set_tasks),
 * which unregisters them all. */
static void register_callbacks(qemu_plugin_id_t id)
{
    qemu_plugin_register_vcpu_init_cb(id, vcpu_init);
    qemu_plugin_register_vcpu_tb_trans_cb(id, tb_trans);
    qemu_plugin_register_atexit_cb(id, plugin_exit, NULL);
}
