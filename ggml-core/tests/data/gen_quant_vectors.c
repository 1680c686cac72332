// Oracle shim for gen_quant_vectors.py (see that script for how to run it).
//
// It is compiled into a shared library together with llama.cpp's own, unmodified
// ggml/src/ggml-quants.c, which provides quantize_row_*_ref and dequantize_row_*.
// This file only adds what lives elsewhere in ggml:
//   - the f32 <-> f16 / bf16 row conversions of ggml.c (ggml_fp32_to_fp16_row,
//     ggml_fp16_to_fp32_row, ggml_fp32_to_bf16_row_ref, ggml_bf16_to_fp32_row),
//     written with the same ggml-impl.h conversion functions they use;
//   - a Q8_1 dequantizer, which ggml does not have (defined here as y = qs * d);
//   - stubs for the few ggml.c symbols ggml-quants.c references but never calls on
//     the paths used here.
//
// Build flags (set by the script): -O2 -ffp-contract=off, no -march, so the x86-64
// baseline (SSE2, no FMA, no F16C) is used and float expressions are evaluated exactly
// as written.

#define GGML_COMMON_DECL_C
#include "ggml-common.h"
#include "ggml-impl.h"
#include "ggml-quants.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void ggml_abort(const char * file, int line, const char * fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "ggml_abort at %s:%d: ", file, line);
    vfprintf(stderr, fmt, args);
    va_end(args);
    abort();
}

size_t ggml_row_size(enum ggml_type type, int64_t ne) {
    (void) type; (void) ne;
    abort();
}

const char * ggml_type_name(enum ggml_type type) {
    (void) type;
    abort();
}

size_t ggml_type_size(enum ggml_type type) {
    (void) type;
    abort();
}

void oracle_fp32_to_fp16_row(const float * x, ggml_fp16_t * y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        y[i] = GGML_FP32_TO_FP16(x[i]);
    }
}

void oracle_fp16_to_fp32_row(const ggml_fp16_t * x, float * y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        y[i] = GGML_FP16_TO_FP32(x[i]);
    }
}

void oracle_fp32_to_bf16_row(const float * x, ggml_bf16_t * y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        y[i] = ggml_compute_fp32_to_bf16(x[i]);
    }
}

void oracle_bf16_to_fp32_row(const ggml_bf16_t * x, float * y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        y[i] = GGML_BF16_TO_FP32(x[i]);
    }
}

// Not in ggml: the obvious dequantizer, in the form of dequantize_row_q8_0.
void oracle_dequantize_row_q8_1(const block_q8_1 * x, float * y, int64_t k) {
    const int64_t nb = k / QK8_1;
    for (int64_t i = 0; i < nb; ++i) {
        const float d = GGML_FP16_TO_FP32(x[i].d);
        for (int j = 0; j < QK8_1; ++j) {
            y[i*QK8_1 + j] = x[i].qs[j]*d;
        }
    }
}
