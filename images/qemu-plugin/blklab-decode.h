/*
 * blklab-decode.h: the x86 instruction decoding of blklab's TCG plugin
 * (blklab-insns.c), apart so that tests can run it on byte strings
 * (images/qemu-plugin/decode-test.c, run by tests/insns.rs).
 *
 * Copyright (C) 2026 the blklab authors
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */
#ifndef BLKLAB_DECODE_H
#define BLKLAB_DECODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Would-be exit kinds; the dump's names are exit_names' in this order. */
enum { EV_HLT, EV_CPUID, EV_WRMSR, EV_IN, EV_OUT, EV_MMIO, EV_KINDS };

/* A legacy prefix (operand/address size, REP/REPNE, LOCK, segments) or
 * REX (40-4f: x86-64 only, which this plugin is for). */
static inline bool is_prefix(uint8_t p)
{
    return p == 0x66 || p == 0x67 || p == 0xf2 || p == 0xf3 || p == 0xf0 || p == 0x2e ||
           p == 0x36 || p == 0x3e || p == 0x26 || p == 0x64 || p == 0x65 ||
           (p & 0xf0) == 0x40;
}

/* VMRUN: 0f 01 d8, after any prefixes, the instruction's whole length. */
static inline bool decode_vmrun(const uint8_t *b, size_t size)
{
    if (size < 3) {
        return false;
    }
    for (size_t i = 0; i + 3 < size; i++) {
        if (!is_prefix(b[i])) {
            return false;
        }
    }
    return b[size - 3] == 0x0f && b[size - 2] == 0x01 && b[size - 1] == 0xd8;
}

/* The would-be exit an instruction of `size` bytes is (-1: none): HLT f4,
 * CPUID 0f a2, WRMSR 0f 30, IN e4/e5 imm8 and ec/ed (DX), OUT e6/e7 imm8
 * and ee/ef (DX), INS 6c/6d and OUTS 6e/6f (DX), after any prefixes. For
 * port I/O, *dx says whether the port is DX, else *port is the imm8. */
static inline int exit_kind(const uint8_t *b, size_t size, bool *dx, uint16_t *port)
{
    size_t i = 0;
    while (i < size && is_prefix(b[i])) {
        i++;
    }
    if (i >= size) {
        return -1;
    }
    uint8_t op = b[i];
    *dx = true;
    *port = 0;
    switch (op) {
    case 0xf4:
        return i + 1 == size ? EV_HLT : -1;
    case 0x0f:
        if (i + 2 != size) {
            return -1;
        }
        return b[i + 1] == 0x30 ? EV_WRMSR : b[i + 1] == 0xa2 ? EV_CPUID : -1;
    case 0xe4: case 0xe5: case 0xe6: case 0xe7:
        if (i + 2 != size) {
            return -1;
        }
        *dx = false;
        *port = b[i + 1];
        return op & 2 ? EV_OUT : EV_IN;
    case 0xec: case 0xed: case 0xee: case 0xef:
        if (i + 1 != size) {
            return -1;
        }
        return op & 2 ? EV_OUT : EV_IN;
    case 0x6c: case 0x6d: case 0x6e: case 0x6f:
        if (i + 1 != size) {
            return -1;
        }
        return op & 2 ? EV_OUT : EV_IN;
    default:
        return -1;
    }
}

#endif
