/*
 * cpu_gemv_int8 - gemv over int8 weights with one f32 scale per output row,
 * prepared at load from any stored float or block type (lossy).
 *
 * prepare() (and prepare_group: several matrices stacked by rows, as the
 * host stacks q/k/v and gate/up) widens each stored row to f32 (one row of
 * scratch per worker), quantises it symmetrically (scale = max|w| / 127,
 * round to nearest) into a plugin-owned [rows, cols] int8 matrix, and never looks at the stored
 * weights again: decode reads 1 byte per weight plus 4 per row. Rows are
 * quantised in blocks of about QUANT_BLOCK_BYTES of stored weights, and each
 * block's pages are handed back to the host (weight_done, host api version
 * 3) as soon as it is done, so that resident memory during and after load
 * is the int8 copy, not the int8 copy beside the stored weights. run() is
 * cpu_gemv's engine with dtype I8 and the row scales: with x_int16 (the
 * default) the activations of few-row calls are quantised to int16 per row
 * and multiplied with integer multiply-adds; many-row calls go through the
 * blocked GEMM (int8 panels widened with their scales) or OpenBLAS sgemm.
 * Q8_0 weights are int8 with a scale per 32 already: they are kept as
 * stored (copied when prepared for the model's life, prepare_group, unless
 * weights: map; experts prepared on demand read in place; never
 * re-quantised), and with x_int16 run through the Q8_0 x int16 kernel
 * (gemv_cpu.h); without it, through cpu_gemv's exact Q8_0 kernels.
 */
#include <math.h>
#include <stddef.h>

#include "core/util/checked.h"
#include "kernels/dtype.h"
#include "plugins/cpu_gemv/gemv_engine.h"

typedef struct cpu_gemv_int8 {
    const tsr_plugin_ctx *ctx;
    gemv_engine_cfg cfg;
    gemv_arena arena; /* weights kept for the model's life (prepare_group) */
    int x_i16;        /* param x_int16 */
    int x_i8;         /* param x_int8: int8 matrices keep their rows' sums of codes for u8 activations */
} cpu_gemv_int8;

static int gi_init(void *inst, const tsr_plugin_ctx *ctx) {
    cpu_gemv_int8 *g = inst;
    g->ctx = ctx;
    const tsr_param *p = ctx->host->param(ctx, "x_int16");
    g->x_i16 = p && p->type == TSR_PARAM_BOOL ? p->v.b : 1;
    p = ctx->host->param(ctx, "x_int8");
    g->x_i8 = p && p->type == TSR_PARAM_BOOL ? p->v.b : 0;
    const int rc = gemv_engine_init(&g->cfg, ctx);
    if (rc != TSR_OK || !g->x_i8) return rc;
    if (!g->x_i16) {
        ctx->host->set_error(ctx, "param x_int8 needs x_int16: true (the 8-bit activations replace the int16 ones)");
        return TSR_ERR_INVALID;
    }
    if (!g->cfg.u8_kernel) {
        ctx->host->set_error(ctx, "param x_int8 needs AVX512-VNNI, which this CPU lacks or param isa leaves out");
        return TSR_ERR_UNSUPPORTED;
    }
    return TSR_OK;
}

static void gi_fini(void *inst) {
    cpu_gemv_int8 *g = inst;
    if (g->ctx) gemv_arena_free(&g->arena, g->ctx);
}

/* Stored bytes quantised between two hand-backs of their pages. */
#define QUANT_BLOCK_BYTES ((uint64_t)1 << 20)

typedef struct quant_job {
    const tsr_plugin_ctx *ctx;
    const tsr_weight *w;
    uint64_t src_row_bytes;
    int64_t block_rows;       /* rows per work item */
    int give_back;            /* the host has weight_done */
    int8_t *q;
    float *scale;
    int32_t *wsum;            /* x_int8: each row's sum of codes, else NULL */
    volatile int nomem;
    volatile int64_t bad_row; /* first row with NaN/Inf seen, or -1 */
    const tsr_weight_scale *wscale; /* the stored weight's scales (FP8 checkpoints), or NULL */
} quant_job;

/* Items are blocks of block_rows rows: quantise a block, then give back the
 * pages of its stored rows. */
static void quant_rows(void *arg, int64_t b0, int64_t b1, int tid) {
    (void)tid;
    quant_job *j = arg;
    int64_t cols = j->w->cols;
    float *row = j->ctx->host->alloc(j->ctx, (size_t)cols * sizeof *row, 64);
    if (!row) {
        j->nomem = 1;
        return;
    }
    const uint8_t *src = j->w->data;
    for (int64_t b = b0; b < b1 && j->bad_row < 0; b++) {
        int64_t r0 = b * j->block_rows, r1 = r0 + j->block_rows < j->w->rows ? r0 + j->block_rows : j->w->rows;
        for (int64_t r = r0; r < r1; r++) {
            tsr_gemv_args one = {.w = src, .row_bytes = j->src_row_bytes, .cols = cols};
            tsr_gemv_widen_rows(j->w->dtype, &one, r, r + 1, row); /* SIMD for f16/bf16/f8; no row scale */
            if (j->wscale) tsr_weight_scale_row(j->wscale, r, cols, row); /* FP8 checkpoints, any scale style */
            float s = tsr_gemv_quant_row_i8(row, cols, j->q + (uint64_t)r * (uint64_t)cols);
            if (!isfinite(s)) {
                j->bad_row = r;
                break;
            }
            j->scale[r] = s;
            if (j->wsum) {
                const int8_t *qr = j->q + (uint64_t)r * (uint64_t)cols;
                int32_t t = 0;
                for (int64_t c = 0; c < cols; c++) t += qr[c];
                j->wsum[r] = t;
            }
        }
        if (j->give_back && j->bad_row < 0)
            j->ctx->host->weight_done(j->ctx, src + (uint64_t)r0 * j->src_row_bytes,
                                      (uint64_t)(r1 - r0) * j->src_row_bytes);
    }
    j->ctx->host->free(j->ctx, row);
}

/* One matrix, or n stacked by rows: quantised into one int8 matrix with
 * its row scales; Q8_0 kept as stored (resident and weights: copy: copied;
 * else read in place, which cannot stack: TSR_ERR_UNSUPPORTED, the host
 * prepares them one by one). */
static int prepare_n(void *inst, const tsr_weight *ws, int n, int resident, void **out) {
    cpu_gemv_int8 *g = inst;
    const tsr_plugin_ctx *ctx = g->ctx;
    uint64_t src_rb, qbytes, sbytes, total;
    int64_t rows;
    int rc = gemv_engine_check_group(ctx, ws, n, &src_rb, &rows);
    if (rc != TSR_OK) return rc;
    const char *name = ws[0].name ? ws[0].name : "(unnamed)";
    const int64_t cols = ws[0].cols;
    gemv_matrix *m = ctx->host->alloc(ctx, sizeof *m, 16);
    if (!m) {
        ctx->host->set_error(ctx, "%s: out of memory", name);
        return TSR_ERR_NOMEM;
    }
    if (ws[0].dtype == TSR_DTYPE_Q8_0) { /* int8 already, with a scale per 32: kept as stored */
        *m = (gemv_matrix){.dtype = TSR_DTYPE_Q8_0, .rows = rows, .cols = cols, .row_bytes = src_rb,
                           .bytes = src_rb * (uint64_t)rows, .x_i16 = g->x_i16,
                           .glu_rows = gemv_engine_glu_rows(ws, n)};
        if ((rc = gemv_engine_weights(&g->cfg, &g->arena, ctx, ws, n, resident, src_rb, &m->data, &m->block)) !=
            TSR_OK) {
            ctx->host->free(ctx, m);
            return rc;
        }
        *out = m;
        return TSR_OK;
    }
    /* int8 matrix, then the scales at a 64-byte boundary (x_int8: then the rows' sums of codes) */
    const int with_sums = g->x_i8 && cols <= TSR_GEMV_U8_MAX_COLS;
    if (tsr_mul_u64((uint64_t)rows, (uint64_t)cols, &qbytes) || tsr_add_u64(qbytes, 63, &qbytes) ||
        tsr_mul_u64((uint64_t)rows, with_sums ? sizeof(float) + sizeof(int32_t) : sizeof(float), &sbytes) ||
        tsr_add_u64(qbytes & ~(uint64_t)63, sbytes, &total) || total > SIZE_MAX / 2) {
        ctx->host->free(ctx, m);
        ctx->host->set_error(ctx, "%s: %lld x %lld int8 copy does not fit in memory", name, (long long)rows,
                             (long long)cols);
        return TSR_ERR_NOMEM;
    }
    qbytes &= ~(uint64_t)63;
    /* for the model's life: in the arena's huge pages; an expert prepared on demand: alone */
    gemv_block *block = NULL;
    uint8_t *buf = resident ? gemv_arena_get(&g->arena, ctx, total, &block) : ctx->host->alloc(ctx, (size_t)total, 64);
    if (!buf) {
        ctx->host->free(ctx, m);
        ctx->host->set_error(ctx, "%s: out of memory for its %llu-byte int8 copy", name,
                             (unsigned long long)total);
        return TSR_ERR_NOMEM;
    }
    float *scale = (float *)(void *)(buf + qbytes);
    int32_t *wsum = with_sums ? (int32_t *)(void *)(scale + rows) : NULL;
    const int64_t block_rows = QUANT_BLOCK_BYTES / src_rb > 0 ? (int64_t)(QUANT_BLOCK_BYTES / src_rb) : 1;
    const int give_back = gemv_engine_can_give_back(ctx->host);
    int64_t r0 = 0;
    for (int i = 0; i < n; i++) {
        const tsr_weight *w = &ws[i];
        quant_job j = {ctx, w, src_rb, block_rows, give_back, (int8_t *)buf + (uint64_t)r0 * (uint64_t)cols,
                       scale + r0, wsum ? wsum + r0 : NULL, 0, -1, tsr_weight_scale_of(ctx, w)};
        ctx->host->parallel_for(ctx, (w->rows + block_rows - 1) / block_rows, quant_rows, &j);
        if (j.nomem || j.bad_row >= 0) {
            if (j.nomem)
                ctx->host->set_error(ctx, "%s: out of memory for a %lld-column row", w->name ? w->name : name,
                                     (long long)cols);
            else
                ctx->host->set_error(ctx, "%s: row %lld holds NaN or Inf: int8 scales need finite weights",
                                     w->name ? w->name : name, (long long)j.bad_row);
            if (block) gemv_arena_put(&g->arena, ctx, block);
            else ctx->host->free(ctx, buf);
            ctx->host->free(ctx, m);
            return j.nomem ? TSR_ERR_NOMEM : TSR_ERR_INVALID;
        }
        /* the pages that straddle two blocks, now that both are done */
        if (give_back) ctx->host->weight_done(ctx, w->data, w->nbytes);
        r0 += w->rows;
    }
    *m = (gemv_matrix){.dtype = TSR_DTYPE_I8, .rows = rows, .cols = cols, .row_bytes = (uint64_t)cols,
                       .data = buf, .scale = scale, .bytes = (uint64_t)rows * (uint64_t)cols + sbytes,
                       .owned = block ? NULL : buf, .block = block, .x_i16 = g->x_i16,
                       .glu_rows = gemv_engine_glu_rows(ws, n), .wsum = wsum};
    *out = m;
    return TSR_OK;
}

/* prepare(): an expert prepared on demand (Q8_0 read in place);
 * prepare_group(): weights for the model's life (Q8_0 copied). */
static int gi_prepare(void *inst, const tsr_weight *w, void **out) { return prepare_n(inst, w, 1, 0, out); }
static int gi_prepare_group(void *inst, const tsr_weight *ws, int n, void **out) {
    return prepare_n(inst, ws, n, 1, out);
}

static void gi_release(void *inst, void *prepared) {
    cpu_gemv_int8 *g = inst;
    gemv_matrix *m = prepared;
    if (!m) return;
    g->ctx->host->free(g->ctx, m->owned);
    gemv_arena_put(&g->arena, g->ctx, m->block);
    g->ctx->host->free(g->ctx, m);
}

static int gi_run(void *inst, const void *prepared, int rows, const float *x, float *y, const tsr_exec *ex) {
    cpu_gemv_int8 *g = inst;
    return gemv_engine_run(&g->cfg, g->ctx, prepared, rows, x, y, ex);
}

static int gi_run_glu(void *inst, const void *prepared, int rows, const float *x, float *y,
                      const tsr_exec *ex) {
    cpu_gemv_int8 *g = inst;
    return gemv_engine_run_glu(&g->cfg, g->ctx, prepared, rows, x, y, ex);
}

static uint64_t gi_bytes(void *inst, const void *prepared) {
    (void)inst;
    return ((const gemv_matrix *)prepared)->bytes;
}

static const tsr_gemv_i cpu_gemv_int8_iface = {
    .struct_size = sizeof(tsr_gemv_i),
    .version = TSR_GEMV_IFACE_VERSION,
    .prepare = gi_prepare,
    .release = gi_release,
    .run = gi_run,
    .bytes = gi_bytes,
    .prepare_group = gi_prepare_group,
    .run_glu = gi_run_glu,
};

static const tsr_plugin_desc cpu_gemv_int8_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .name = "cpu_gemv_int8",
    .slot = TSR_SLOT_GEMV,
    .version = "1.0.0",
    .instance_size = sizeof(cpu_gemv_int8),
    .caps = TSR_CAP_DEVICE_CPU,
    .init = gi_init,
    .fini = gi_fini,
    .iface = &cpu_gemv_int8_iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *TSR_PLUGIN_ENTRY(void) { return &cpu_gemv_int8_desc; }
