/*
 * mk_gguf - a GGUF file from a dense Llama, Qwen2 or Qwen3 safetensors checkpoint,
 * its matrices stored as Q8_0 (or f32, or a Q4_K_M-like mix), for
 * benchmarks of block-quantised decode at shapes no shipped GGUF has (the
 * random checkpoints of ../shared/tools/mk_random_checkpoint.py) and for
 * tests.
 *
 *   mk_gguf SRC DST.gguf [--type q8_0|f32|q4_k_m]
 *
 * q4_k_m: as llama.cpp's Q4_K_M lays types out: Q6_K for the output head
 * (token_embd too, which serves as the head of tied models), attn_v and
 * ffn_down, Q4_K for the other matrices whose rows are whole 256-element
 * blocks, Q8_0 for the rest. Its Q4_K and Q6_K blocks are kernels/dtype.h's
 * tsr_quant_q4_k / tsr_quant_q6_k (plain min-max / absmax per sub-block, not
 * llama.cpp's searched scales): meant for speed, which does not depend on
 * the values.
 *
 * SRC: a folder tessera reads (config.json + safetensors, f32/f16/bf16).
 * Every 2-D weight whose columns are whole 32-element blocks becomes the
 * chosen type (Q8_0: per 32 weights d = max|w| / 127 rounded to f16, q =
 * round(w / d), as llama.cpp quantises), the rest f32. Names and metadata as
 * llama.cpp writes them (general.architecture, ARCH.block_count, ...); for
 * llama the q/k rows are reordered into the interleaved RoPE pairs GGUF
 * llama files keep (llama.cpp's converter does the same), so that the file
 * computes what SRC computes. No tokenizer is written: tessera reads the
 * vocabulary size from token_embd; run it with --random-prompt. Mixtures of
 * experts and FP8 checkpoints are refused.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/format/format_internal.h"
#include "core/format/model_file.h"
#include "kernels/dtype.h"

enum { GGML_F32 = 0, GGML_Q8_0 = 8, GGML_Q4_K = 12, GGML_Q6_K = 14, MIX_Q4_K_M = 1000 };
enum { KV_U32 = 4, KV_F32 = 6, KV_STRING = 8 };
#define ALIGN 32

static void die(const char *fmt, const char *arg) {
    fprintf(stderr, "mk_gguf: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n");
    exit(2);
}

static void put(FILE *f, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, f) != n) die("write failed%s", "");
}
static void put_u32(FILE *f, uint32_t v) { put(f, &v, 4); }
static void put_u64(FILE *f, uint64_t v) { put(f, &v, 8); }
static void put_str(FILE *f, const char *s) {
    put_u64(f, strlen(s));
    put(f, s, strlen(s));
}
/* A model metadata key ARCH.key: a u32 or an f32 value. */
typedef struct meta {
    const char *key;
    uint32_t type; /* KV_U32 or KV_F32 */
    uint32_t u;
    float f;
} meta;

static void put_meta(FILE *f, const char *arch, const meta *m) {
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, m->key);
    put_str(f, k);
    put_u32(f, m->type);
    if (m->type == KV_U32) put_u32(f, m->u);
    else put(f, &m->f, 4);
}

typedef struct out_tensor {
    char name[96];
    const tsr_tensor *src;
    uint32_t type;
    uint64_t offset, bytes;
    int permute_heads; /* llama q/k: heads to reorder into interleaved pairs (0: none) */
} out_tensor;

/* A 2-D tensor's rows and columns; a 1-D one is one row. */
static int64_t rows_of(const tsr_tensor *t) { return t->n_dims == 2 ? t->shape[0] : 1; }
static int64_t cols_of(const tsr_tensor *t) { return t->n_dims == 2 ? t->shape[1] : t->shape[0]; }

/* Row r of t as f32, row r of the file for a permuted q/k: GGUF row
 * h * hd + 2 i + j holds HF row h * hd + j * hd / 2 + i. */
static void read_row(const out_tensor *o, int64_t r, float *dst) {
    const tsr_tensor *t = o->src;
    const int64_t cols = cols_of(t);
    if (o->permute_heads) {
        const int64_t hd = t->shape[0] / o->permute_heads, h = r / hd, i = (r % hd) / 2, j = r % 2;
        r = h * hd + j * (hd / 2) + i;
    }
    uint64_t rb;
    if (tsr_dtype_row_bytes(t->dtype, cols, &rb) != 0) die("%s: rows of an unreadable size", t->name);
    tsr_dequant_row(t->dtype, (const uint8_t *)t->data + (uint64_t)r * rb, dst, cols);
}

static void write_data(FILE *f, const out_tensor *o, float *row, int8_t *q) {
    const tsr_tensor *t = o->src;
    const int64_t rows = rows_of(t), cols = cols_of(t);
    for (int64_t r = 0; r < rows; r++) {
        read_row(o, r, row);
        if (o->type == GGML_F32) {
            put(f, row, (size_t)cols * 4);
            continue;
        }
        if (o->type == GGML_Q4_K || o->type == GGML_Q6_K) {
            const uint32_t dt = o->type == GGML_Q4_K ? TSR_DTYPE_Q4_K : TSR_DTYPE_Q6_K;
            uint8_t blk[210];
            for (int64_t b = 0; b < cols; b += 256) {
                if (dt == TSR_DTYPE_Q4_K) tsr_quant_q4_k(row + b, blk);
                else tsr_quant_q6_k(row + b, blk);
                put(f, blk, (size_t)tsr_dtype_block_bytes(dt));
            }
            continue;
        }
        for (int64_t b = 0; b < cols; b += 32) {
            float amax = 0;
            for (int k = 0; k < 32; k++) amax = fmaxf(amax, fabsf(row[b + k]));
            const uint16_t dh = tsr_f32_to_f16(amax / 127.0f);
            const float d = tsr_f16_to_f32(dh), inv = d != 0.0f ? 1.0f / d : 0.0f;
            for (int k = 0; k < 32; k++) {
                const float v = roundf(row[b + k] * inv);
                q[k] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
            }
            put(f, &dh, 2);
            put(f, q, 32);
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 3 && !(argc == 5 && !strcmp(argv[3], "--type")))
        die("usage: mk_gguf SRC DST.gguf [--type q8_0|f32|q4_k_m]%s", "");
    const char *ty = argc == 5 ? argv[4] : "q8_0";
    const uint32_t type = !strcmp(ty, "f32") ? GGML_F32 : !strcmp(ty, "q4_k_m") ? MIX_Q4_K_M : GGML_Q8_0;
    if (strcmp(ty, "f32") && strcmp(ty, "q8_0") && strcmp(ty, "q4_k_m")) die("--type %s: q8_0, f32 or q4_k_m", ty);
    tsr_model_file *mf;
    tsr_error err = {0};
    if (tsr_model_file_open(argv[1], &mf, &err) != TSR_OK) die("%s", err.msg);
    const tsr_model_config *c = tsr_model_file_config(mf);
    const int llama = c->arch == TSR_ARCH_LLAMA;
    if (!llama && c->arch != TSR_ARCH_QWEN2 && c->arch != TSR_ARCH_QWEN3)
        die("%s: only dense llama, qwen2 and qwen3 checkpoints", c->arch_name);
    if (c->rope_scaling != TSR_ROPE_NONE) die("%s: RoPE scaling is not written", argv[1]);
    const int n = tsr_model_file_n_tensors(mf);
    out_tensor *ot = calloc((size_t)n, sizeof *ot);
    int64_t widest = 0;
    uint64_t at = 0;
    if (!ot) die("out of memory%s", "");
    for (int i = 0; i < n; i++) {
        out_tensor *o = &ot[i];
        const tsr_tensor *t = o->src = tsr_model_file_tensor_at(mf, i);
        if (t->scale) die("%s: FP8 checkpoints are not converted", t->name);
        if (!tsr_hf_name_to_gguf(t->name, o->name, sizeof o->name) || t->n_dims > 2)
            die("%s: no GGUF name for it (dense llama/qwen2/qwen3 tensors only)", t->name);
        const int64_t rows = rows_of(t), cols = cols_of(t);
        o->type = t->n_dims == 2 && cols % 32 == 0 ? type : GGML_F32;
        if (o->type == MIX_Q4_K_M) {
            const int six = strstr(o->name, "output.") || strstr(o->name, "token_embd.") ||
                            strstr(o->name, ".attn_v.") || strstr(o->name, ".ffn_down.");
            o->type = cols % 256 ? GGML_Q8_0 : six ? GGML_Q6_K : GGML_Q4_K;
        }
        const uint32_t dt = o->type == GGML_F32    ? TSR_DTYPE_F32
                            : o->type == GGML_Q8_0 ? TSR_DTYPE_Q8_0
                            : o->type == GGML_Q4_K ? TSR_DTYPE_Q4_K
                                                   : TSR_DTYPE_Q6_K;
        uint64_t rb;
        if (tsr_dtype_row_bytes(dt, cols, &rb) != 0) die("%s: rows of an unwritable size", t->name);
        o->bytes = (uint64_t)rows * rb;
        if (llama && strstr(o->name, ".attn_q.")) o->permute_heads = c->n_heads;
        if (llama && strstr(o->name, ".attn_k.")) o->permute_heads = c->n_kv_heads;
        o->offset = at;
        at += (o->bytes + ALIGN - 1) / ALIGN * ALIGN;
        if (cols > widest) widest = cols;
    }
    FILE *f = fopen(argv[2], "wb");
    if (!f) die("cannot write %s", argv[2]);
    const char *arch = llama ? "llama" : c->arch == TSR_ARCH_QWEN2 ? "qwen2" : "qwen3";
    put(f, "GGUF", 4);
    put_u32(f, 3);
    put_u64(f, (uint64_t)n);
    const meta md[] = {
        {"block_count", KV_U32, (uint32_t)c->n_layers, 0},
        {"embedding_length", KV_U32, (uint32_t)c->hidden, 0},
        {"feed_forward_length", KV_U32, (uint32_t)c->ffn, 0},
        {"attention.head_count", KV_U32, (uint32_t)c->n_heads, 0},
        {"attention.head_count_kv", KV_U32, (uint32_t)c->n_kv_heads, 0},
        {"attention.key_length", KV_U32, (uint32_t)c->head_dim, 0},
        {"context_length", KV_U32, (uint32_t)c->max_ctx, 0},
        {"attention.layer_norm_rms_epsilon", KV_F32, 0, c->norm_eps},
        {"rope.freq_base", KV_F32, 0, c->rope_theta},
    };
    const size_t n_md = sizeof md / sizeof md[0];
    put_u64(f, 1 + n_md); /* general.architecture, then the model's keys */
    put_str(f, "general.architecture");
    put_u32(f, KV_STRING);
    put_str(f, arch);
    for (size_t i = 0; i < n_md; i++) put_meta(f, arch, &md[i]);
    for (int i = 0; i < n; i++) {
        const tsr_tensor *t = ot[i].src;
        put_str(f, ot[i].name);
        put_u32(f, (uint32_t)t->n_dims);
        for (int d = t->n_dims - 1; d >= 0; d--) put_u64(f, (uint64_t)t->shape[d]); /* innermost first */
        put_u32(f, ot[i].type);
        put_u64(f, ot[i].offset);
    }
    static const uint8_t zero[ALIGN];
    put(f, zero, (size_t)((ALIGN - ftell(f) % ALIGN) % ALIGN));
    float *row = malloc((size_t)widest * sizeof *row);
    int8_t q[32];
    if (!row) die("out of memory%s", "");
    for (int i = 0; i < n; i++) {
        write_data(f, &ot[i], row, q);
        put(f, zero, (size_t)((ALIGN - ot[i].bytes % ALIGN) % ALIGN));
    }
    if (fclose(f) != 0) die("cannot finish %s", argv[2]);
    free(row);
    free(ot);
    tsr_model_file_close(mf);
    return 0;
}
