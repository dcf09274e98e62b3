/*
 * stop-test: may_stop_block, is_rep_string and always_accesses_memory
 * (blklab-decode.h) on known encodings; run by tests/insns_exact.rs. Prints one line per failure and a last line
 * "N passed, M failed"; exits 1 on any failure.
 *
 * Copyright (C) 2026 the blklab authors
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */
#include <stdio.h>

#include "blklab-decode.h"

typedef struct {
    const char *name;
    uint8_t bytes[16];
    size_t size;
    bool may_stop;
} Case;

static const Case cases[] = {
    /* Register-only: cannot stop a block. */
    {"add $1, %r8", {0x49, 0x83, 0xc0, 0x01}, 4, false},
    {"add %eax, %ebx", {0x01, 0xc3}, 2, false},
    {"xor %eax, %eax", {0x31, 0xc0}, 2, false},
    {"cmp $5, %al", {0x3c, 0x05}, 2, false},
    {"mov %r12, %rdi", {0x4c, 0x89, 0xe7}, 3, false},
    {"mov $0x7d0, %ecx", {0xb9, 0xd0, 0x07, 0x00, 0x00}, 5, false},
    {"movabs $1, %rax", {0x48, 0xb8, 1, 0, 0, 0, 0, 0, 0, 0}, 10, false},
    {"lea 0x10(%rdi), %rax", {0x48, 0x8d, 0x47, 0x10}, 4, false},
    {"dec %ecx", {0xff, 0xc9}, 2, false},
    {"neg %rax", {0x48, 0xf7, 0xd8}, 3, false},
    {"imul %rbx, %rax", {0x48, 0x0f, 0xaf, 0xc3}, 4, false},
    {"shl $3, %rax", {0x48, 0xc1, 0xe0, 0x03}, 4, false},
    {"movzbl %al, %eax", {0x0f, 0xb6, 0xc0}, 3, false},
    {"movslq %eax, %rax", {0x48, 0x63, 0xc0}, 3, false},
    {"cmove %rbx, %rax", {0x48, 0x0f, 0x44, 0xc3}, 4, false},
    {"sete %al", {0x0f, 0x94, 0xc0}, 3, false},
    {"test %eax, %eax", {0x85, 0xc0}, 2, false},
    {"nopw 0x0(%rax,%rax,1)", {0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00}, 6, false},
    {"nop", {0x90}, 1, false},
    {"jne rel8", {0x75, 0xfe}, 2, false},
    {"jne rel32", {0x0f, 0x85, 0, 0, 0, 0}, 6, false},
    {"bt %rax, %rbx", {0x48, 0x0f, 0xa3, 0xc3}, 4, false},
    {"bts $3, %eax", {0x0f, 0xba, 0xe8, 0x03}, 4, false},
    /* Memory, helpers that fault, prefixes that change them: may stop. */
    {"mov (%rdi), %rax", {0x48, 0x8b, 0x07}, 3, true},
    {"movb $1, (%rdi)", {0xc6, 0x07, 0x01}, 3, true},
    {"mov %ecx, 4(%rbx)", {0x89, 0x4b, 0x04}, 3, true},
    {"add (%rdi), %eax", {0x03, 0x07}, 2, true},
    {"addl $1, (%rdi)", {0x83, 0x07, 0x01}, 3, true},
    {"push %rbp", {0x55}, 1, true},
    {"pop %rbp", {0x5d}, 1, true},
    {"call rel32", {0xe8, 0, 0, 0, 0}, 5, true},
    {"ret", {0xc3}, 1, true},
    {"div %rcx", {0x48, 0xf7, 0xf1}, 3, true},
    {"idiv %ecx", {0xf7, 0xf9}, 2, true},
    {"lock add %eax, (%rdi)", {0xf0, 0x01, 0x07}, 3, true},
    {"tzcnt %eax, %eax", {0xf3, 0x0f, 0xbc, 0xc0}, 4, true},
    {"pause", {0xf3, 0x90}, 2, true},
    {"rep movsb", {0xf3, 0xa4}, 2, true},
    {"movdqa %xmm0, %xmm1", {0x66, 0x0f, 0x6f, 0xc8}, 4, true},
    {"mov %gs:0x10, %rax", {0x65, 0x48, 0x8b, 0x04, 0x25, 0x10, 0, 0, 0}, 9, true},
    {"cpuid", {0x0f, 0xa2}, 2, true},
    {"wrmsr", {0x0f, 0x30}, 2, true},
    {"syscall", {0x0f, 0x05}, 2, true},
    {"cli", {0xfa}, 1, true},
    {"lea of a register (#UD)", {0x8d, 0xc0}, 2, true},
    {"inc %eax (32-bit mode)", {0x40}, 1, true},
    {"bt $1, (%rdi)", {0x0f, 0xba, 0x27, 0x01}, 4, true},
    {"sal /6", {0xd1, 0xf0}, 2, true},
    {"vmovdqu (VEX)", {0xc5, 0xfe, 0x6f, 0x07}, 4, true},
    {"movsb", {0xa4}, 1, true},
    {"xchg %eax, (%rdi)", {0x87, 0x07}, 2, true},
};

typedef struct {
    const char *name;
    uint8_t bytes[16];
    size_t size;
    bool rep; /* what the function tested should say */
} RepCase;

static const RepCase rep_cases[] = {
    {"rep movsb", {0xf3, 0xa4}, 2, true},
    {"rep stosq", {0xf3, 0x48, 0xab}, 3, true},
    {"repne scasb", {0xf2, 0xae}, 2, true},
    {"rep outsb", {0xf3, 0x6e}, 2, true},
    {"movsb", {0xa4}, 1, false},
    {"pause", {0xf3, 0x90}, 2, false},
    {"tzcnt %eax, %eax", {0xf3, 0x0f, 0xbc, 0xc0}, 4, false},
    {"mov (%rdi), %rax", {0x48, 0x8b, 0x07}, 3, false},
};

static const RepCase mem_cases[] = {
    {"call rel32", {0xe8, 0, 0, 0, 0}, 5, true},
    {"call *%rax", {0xff, 0xd0}, 2, true},
    {"call *0x8(%rax)", {0xff, 0x50, 0x08}, 3, true},
    {"jmp *0x8(%rax)", {0xff, 0x60, 0x08}, 3, true},
    {"ret", {0xc3}, 1, true},
    {"ret $8", {0xc2, 0x08, 0x00}, 3, true},
    {"push %r12", {0x41, 0x54}, 2, true},
    {"pop %rbp", {0x5d}, 1, true},
    {"push $1", {0x6a, 0x01}, 2, true},
    {"leave", {0xc9}, 1, true},
    {"mov %rax, (%rdi)", {0x48, 0x89, 0x07}, 3, true},
    {"mov %gs:0x10, %rax", {0x65, 0x48, 0x8b, 0x04, 0x25, 0x10, 0, 0, 0}, 9, true},
    {"movl $1, (%rdi)", {0xc7, 0x07, 1, 0, 0, 0}, 6, true},
    {"jmp *%rax", {0xff, 0xe0}, 2, false},
    {"mov %rax, %rdi", {0x48, 0x89, 0xc7}, 3, false},
    {"lea 0x10(%rdi), %rax", {0x48, 0x8d, 0x47, 0x10}, 4, false},
    {"jne rel8", {0x75, 0xfe}, 2, false},
    {"rep movsb", {0xf3, 0xa4}, 2, false},
    {"syscall", {0x0f, 0x05}, 2, false},
    {"inc %eax (32-bit mode)", {0x40}, 1, false},
};

int main(void)
{
    int passed = 0, failed = 0;
    for (size_t i = 0; i < sizeof(mem_cases) / sizeof(mem_cases[0]); i++) {
        const RepCase *c = &mem_cases[i];
        bool got = always_accesses_memory(c->bytes, c->size);
        if (got == c->rep) {
            passed++;
        } else {
            failed++;
            printf("FAIL %s: always_accesses_memory %d, want %d\n", c->name, got, c->rep);
        }
    }
    for (size_t i = 0; i < sizeof(rep_cases) / sizeof(rep_cases[0]); i++) {
        const RepCase *c = &rep_cases[i];
        bool got = is_rep_string(c->bytes, c->size);
        if (got == c->rep) {
            passed++;
        } else {
            failed++;
            printf("FAIL %s: is_rep_string %d, want %d\n", c->name, got, c->rep);
        }
    }
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const Case *c = &cases[i];
        bool got = may_stop_block(c->bytes, c->size);
        if (got == c->may_stop) {
            passed++;
        } else {
            failed++;
            printf("FAIL %s: may_stop_block %d, want %d\n", c->name, got, c->may_stop);
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
