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

/* A string instruction with a REP or REPNE prefix (f3/f2, then other
 * prefixes, then a4-a7, aa-af or 6c-6f). */
static inline bool is_rep_string(const uint8_t *b, size_t size)
{
    bool rep = false;
    size_t i = 0;
    for (; i < size && is_prefix(b[i]); i++) {
        rep |= b[i] == 0xf2 || b[i] == 0xf3;
    }
    if (!rep || i + 1 != size) {
        return false;
    }
    uint8_t op = b[i];
    return (op >= 0xa4 && op <= 0xa7) || (op >= 0xaa && op <= 0xaf) || (op >= 0x6c && op <= 0x6f);
}

/* Whether an instruction of `size` bytes touches memory whenever it
 * finishes: CALL rel32 (e8) and CALL/PUSH r/m (ff /2, /6) push, RET (c3,
 * c2) pops, JMP m (ff /4 of memory) loads, PUSH/POP r (50-5f), PUSH imm
 * (68, 6a), LEAVE (c9), MOV to or from memory (88-8b, c6/c7 /0, with a
 * memory operand). Only REX, operand-size and FS/GS prefixes may precede
 * them. */
static inline bool always_accesses_memory(const uint8_t *b, size_t size)
{
    size_t i = 0;
    while (i < size && (b[i] == 0x66 || b[i] == 0x64 || b[i] == 0x65 || (b[i] & 0xf0) == 0x40)) {
        i++;
    }
    if (i >= size) {
        return false;
    }
    uint8_t op = b[i];
    bool mem = i + 1 < size && b[i + 1] >> 6 != 3;
    uint8_t reg = i + 1 < size ? (b[i + 1] >> 3) & 7 : 0;
    switch (op) {
    case 0xe8: case 0xc3: case 0xc2: case 0x68: case 0x6a: case 0xc9:
        return true;
    case 0x88: case 0x89: case 0x8a: case 0x8b:
        return mem;
    case 0xc6: case 0xc7:
        return mem && reg == 0;
    case 0xff:
        return i + 1 < size && (reg == 2 || reg == 6 || (reg == 4 && mem));
    default:
        return op >= 0x50 && op <= 0x5f;
    }
}

/* Whether an instruction of `size` bytes may stop its translation block
 * before it finishes: false only for instructions known to touch neither
 * memory nor a helper that can fault, whatever their operands (a register
 * operand, ModRM mod 3, where the opcode also has memory forms):
 * ALU ops (00-3d, 80/81/83, 84/85, a8/a9), MOV (88-8b, b0-bf), XCHG (87,
 * 90-97), LEA (8d, memory form: it only computes the address), MOVSXD
 * (63), IMUL (69, 6b, 0f af), CBW/CWD (98/99), shifts and rotates (c0/c1,
 * d0-d3 but /6), TEST/NOT/NEG/MUL/IMUL (f6/f7 /0 /2-/5; not DIV, which
 * raises #DE), INC/DEC (fe/ff /0 /1), CMC/CLC/STC/CLD/STD, CMOVcc,
 * SETcc, MOVZX/MOVSX, BT* (0f a3/ab/b3/bb, 0f ba /4-/7), SHLD/SHRD, BSF/
 * BSR, NOP (0f 1f: its memory form accesses nothing), Jcc and JMP rel
 * (70-7f, eb, e9, 0f 80-8f). Only operand-size (66) and REX prefixes may
 * precede them (a REP prefix makes BSF TZCNT, LOCK faults here); anything
 * else may stop its block. */
static inline bool may_stop_block(const uint8_t *b, size_t size)
{
    size_t i = 0;
    while (i < size && (b[i] == 0x66 || (b[i] & 0xf0) == 0x40)) {
        i++;
    }
    if (i >= size) {
        return true;
    }
    uint8_t op = b[i];
    bool has_modrm = i + 1 < size;
    uint8_t mod = has_modrm ? b[i + 1] >> 6 : 0;
    uint8_t reg = has_modrm ? (b[i + 1] >> 3) & 7 : 0;
    bool rm_reg = has_modrm && mod == 3;
    if (op < 0x40 && op != 0x0f) {
        if ((op & 7) <= 3) {
            return !rm_reg; /* ALU r/m, r and r, r/m */
        }
        return (op & 7) > 5; /* 04/05 ALU AL/eAX, imm; others: prefixes, invalid */
    }
    if ((op >= 0x70 && op <= 0x7f) || (op >= 0x90 && op <= 0x99) || (op >= 0xb0 && op <= 0xbf) ||
        op == 0xa8 || op == 0xa9 || op == 0xe9 || op == 0xeb || op == 0xf5 || op == 0xf8 ||
        op == 0xf9 || op == 0xfc || op == 0xfd) {
        return false;
    }
    switch (op) {
    case 0x63: case 0x69: case 0x6b: case 0x80: case 0x81: case 0x83:
    case 0x84: case 0x85: case 0x87: case 0x88: case 0x89: case 0x8a: case 0x8b:
        return !rm_reg;
    case 0x8d:
        return !has_modrm || mod == 3; /* LEA of a register is #UD */
    case 0xc0: case 0xc1: case 0xd0: case 0xd1: case 0xd2: case 0xd3:
        return !rm_reg || reg == 6;
    case 0xf6: case 0xf7:
        return !rm_reg || reg == 1 || reg >= 6;
    case 0xfe: case 0xff:
        return !rm_reg || reg > 1;
    case 0x0f:
        break;
    default:
        return true;
    }
    if (i + 1 >= size) {
        return true;
    }
    uint8_t op2 = b[i + 1];
    has_modrm = i + 2 < size;
    mod = has_modrm ? b[i + 2] >> 6 : 0;
    reg = has_modrm ? (b[i + 2] >> 3) & 7 : 0;
    rm_reg = has_modrm && mod == 3;
    if (op2 >= 0x80 && op2 <= 0x8f) {
        return false; /* Jcc rel32 */
    }
    if (op2 == 0x1f) {
        return !has_modrm;
    }
    if ((op2 >= 0x40 && op2 <= 0x4f) || (op2 >= 0x90 && op2 <= 0x9f)) {
        return !rm_reg;
    }
    switch (op2) {
    case 0xa3: case 0xa4: case 0xa5: case 0xab: case 0xac: case 0xad: case 0xaf:
    case 0xb3: case 0xb6: case 0xb7: case 0xbb: case 0xbc: case 0xbd: case 0xbe: case 0xbf:
        return !rm_reg;
    case 0xba:
        return !rm_reg || reg < 4;
    default:
        return true;
    }
}

#endif
