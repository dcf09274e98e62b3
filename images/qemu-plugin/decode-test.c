/*
 * decode-test: blklab-decode.h's decoders on known instruction encodings.
 * Prints one line per failed case and "N passed, M failed"; exits non-zero
 * on a failure. Built and run by tests/insns.rs.
 *
 * Copyright (C) 2026 the blklab authors
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */
#include <stdio.h>
#include <string.h>

#include "blklab-decode.h"

typedef struct {
    const char *what;
    uint8_t bytes[15];
    size_t size;
    int kind; /* -1: not an exit */
    int dx;   /* port I/O: 1 DX, 0 imm8 */
    unsigned port;
} Case;

static const Case cases[] = {
    {"hlt", {0xf4}, 1, EV_HLT, 1, 0},
    {"cpuid", {0x0f, 0xa2}, 2, EV_CPUID, 1, 0},
    {"wrmsr", {0x0f, 0x30}, 2, EV_WRMSR, 1, 0},
    {"rdmsr is not one", {0x0f, 0x32}, 2, -1, 0, 0},
    {"outb %al,$0x80", {0xe6, 0x80}, 2, EV_OUT, 0, 0x80},
    {"outl %eax,$0x70", {0xe7, 0x70}, 2, EV_OUT, 0, 0x70},
    {"inb $0x71,%al", {0xe4, 0x71}, 2, EV_IN, 0, 0x71},
    {"inl $0x60,%eax", {0xe5, 0x60}, 2, EV_IN, 0, 0x60},
    {"outw %ax,(%dx) (66 prefix)", {0x66, 0xef}, 2, EV_OUT, 1, 0},
    {"outb %al,(%dx)", {0xee}, 1, EV_OUT, 1, 0},
    {"inb (%dx),%al", {0xec}, 1, EV_IN, 1, 0},
    {"inl (%dx),%eax", {0xed}, 1, EV_IN, 1, 0},
    {"rep insb", {0xf3, 0x6c}, 2, EV_IN, 1, 0},
    {"rep insl (67 66)", {0x67, 0x66, 0xf3, 0x6d}, 4, EV_IN, 1, 0},
    {"rep outsb", {0xf3, 0x6e}, 2, EV_OUT, 1, 0},
    {"outsl with a segment prefix", {0x2e, 0x6f}, 2, EV_OUT, 1, 0},
    {"rex.w wrmsr", {0x48, 0x0f, 0x30}, 3, EV_WRMSR, 1, 0},
    {"ds hlt", {0x3e, 0xf4}, 2, EV_HLT, 1, 0},
    {"mov %eax,(%rdx) (89 02)", {0x89, 0x02}, 2, -1, 0, 0},
    {"jmp rel8 to 0xf4 is not hlt", {0xeb, 0xf4}, 2, -1, 0, 0},
    {"mov $0xe6,%al: an imm8 of e6", {0xb0, 0xe6}, 2, -1, 0, 0},
    {"push $0xec", {0x6a, 0xec}, 2, -1, 0, 0},
    {"ud2", {0x0f, 0x0b}, 2, -1, 0, 0},
    {"nopw 0x0(%rax,%rax,1) (66 0f 1f 44 00 00)", {0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00}, 6, -1, 0, 0},
    {"vmrun is not one", {0x0f, 0x01, 0xd8}, 3, -1, 0, 0},
    {"prefixes only", {0x66, 0xf3}, 2, -1, 0, 0},
    {"a truncated out imm8", {0xe6}, 1, -1, 0, 0},
};

int main(void)
{
    int passed = 0, failed = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const Case *c = &cases[i];
        bool dx = false;
        uint16_t port = 0xffff;
        int k = exit_kind(c->bytes, c->size, &dx, &port);
        bool ok = k == c->kind;
        if (ok && (k == EV_IN || k == EV_OUT)) {
            ok = dx == (c->dx != 0) && (dx || port == c->port);
        }
        if (ok) {
            passed++;
        } else {
            failed++;
            printf("FAIL %s: kind %d dx %d port %#x (want kind %d dx %d port %#x)\n", c->what, k,
                   dx, port, c->kind, c->dx, c->port);
        }
    }
    /* VMRUN, with and without prefixes; not a longer instruction ending
     * in its bytes. */
    static const uint8_t vmrun[] = {0x0f, 0x01, 0xd8};
    static const uint8_t vmrun_p[] = {0x67, 0x0f, 0x01, 0xd8};
    static const uint8_t not_vmrun[] = {0xb8, 0x0f, 0x01, 0xd8, 0x00};
    static const uint8_t mov_ending[] = {0xc7, 0x00, 0x0f, 0x01, 0xd8};
    bool v[] = {decode_vmrun(vmrun, 3), decode_vmrun(vmrun_p, 4), !decode_vmrun(not_vmrun, 5),
                !decode_vmrun(mov_ending, 5), !decode_vmrun((const uint8_t *)"\xf4", 1)};
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        if (v[i]) {
            passed++;
        } else {
            failed++;
            printf("FAIL vmrun case %zu\n", i);
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
