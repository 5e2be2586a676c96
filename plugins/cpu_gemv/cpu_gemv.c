/*
 * cpu_gemv - SIMD gemv over the weights exactly as stored.
 *
 * prepare_group() (weights the host keeps for the model's life, one alone
 * or several stacked) checks the matrices and copies their bytes as stored
 * into memory backed by 2 MiB pages where the kernel gives them, giving the
 * mapped pages back (param weights: copy; with weights: map it keeps a
 * borrowed view of the mapping instead); prepare() (an expert prepared on
 * demand) keeps a borrowed view: f32/f16/bf16/i8/f8_e4m3 are converted in
 * registers, GGUF Q8_0 and Q4_K blocks are decoded in registers, the other
 * block types 256 elements at a time on the stack; FP8 checkpoints' scales
 * are applied to each row's sum (per tensor, per channel) or to each
 * block's (blocks along rows, e.g. 128 x 128); the matrix is never
 * widened or converted in memory. run() splits the output rows
 * over the host's pool and reads each weight row once for every input row
 * (decode, verification). From blas_min_rows input rows on (prefill), the
 * blocked GEMM of kernels/cpu/gemm_cpu.h widens each 16-row weight panel
 * once in registers for all input rows (or, with prefill: blas, tiles of
 * weight rows are widened to f32 and multiplied by OpenBLAS sgemm).
 */
#include "gemv_engine.h"

typedef struct cpu_gemv {
    const tsr_plugin_ctx *ctx;
    gemv_engine_cfg cfg;
    gemv_arena arena; /* the copied weights (gemv_engine_weights) */
} cpu_gemv;

static int cg_init(void *inst, const tsr_plugin_ctx *ctx) {
    cpu_gemv *g = inst;
    g->ctx = ctx;
    return gemv_engine_init(&g->cfg, ctx);
}

static void cg_fini(void *inst) {
    cpu_gemv *g = inst;
    if (g->ctx) gemv_arena_free(&g->arena, g->ctx);
}

/* n matrices stacked by rows; resident: the host keeps them for the
 * model's life (prepare_group), copied (gemv_engine_weights). */
static int prepare_n(void *inst, const tsr_weight *ws, int n, int resident, void **out) {
    cpu_gemv *g = inst;
    uint64_t row_bytes;
    int64_t rows;
    int rc = gemv_engine_check_group(g->ctx, ws, n, &row_bytes, &rows);
    if (rc != TSR_OK) return rc;
    gemv_matrix *m = g->ctx->host->alloc(g->ctx, sizeof *m, 16);
    if (!m) {
        g->ctx->host->set_error(g->ctx, "%s: out of memory", ws[0].name ? ws[0].name : "(unnamed)");
        return TSR_ERR_NOMEM;
    }
    *m = (gemv_matrix){.dtype = ws[0].dtype, .rows = rows, .cols = ws[0].cols, .row_bytes = row_bytes,
                       .bytes = row_bytes * (uint64_t)rows, .glu_rows = gemv_engine_glu_rows(ws, n)};
    if ((rc = gemv_engine_scales(g->ctx, ws, n, m)) != TSR_OK || /* FP8 checkpoints */
        (rc = gemv_engine_weights(&g->cfg, &g->arena, g->ctx, ws, n, resident, row_bytes, &m->data, &m->block)) !=
            TSR_OK) {
        g->ctx->host->free(g->ctx, m->owned);
        g->ctx->host->free(g->ctx, m);
        return rc;
    }
    *out = m;
    return TSR_OK;
}

/* One matrix prepared on demand (an expert): read in place. */
static int cg_prepare(void *inst, const tsr_weight *w, void **out) { return prepare_n(inst, w, 1, 0, out); }

/* Weights for the model's life, one alone or several stacked (with
 * weights: map, several answer TSR_ERR_UNSUPPORTED: the host prepares them
 * one by one). */
static int cg_prepare_group(void *inst, const tsr_weight *ws, int n, void **out) {
    return prepare_n(inst, ws, n, 1, out);
}

static void cg_release(void *inst, void *prepared) {
    cpu_gemv *g = inst;
    if (prepared) {
        gemv_arena_put(&g->arena, g->ctx, ((gemv_matrix *)prepared)->block);
        g->ctx->host->free(g->ctx, ((gemv_matrix *)prepared)->owned); /* the FP8 scales, if any */
    }
    g->ctx->host->free(g->ctx, prepared);
}

static int cg_run(void *inst, const void *prepared, int rows, const float *x, float *y, const tsr_exec *ex) {
    cpu_gemv *g = inst;
    return gemv_engine_run(&g->cfg, g->ctx, prepared, rows, x, y, ex);
}

static int cg_run_glu(void *inst, const void *prepared, int rows, const float *x, float *y,
                      const tsr_exec *ex) {
    cpu_gemv *g = inst;
    return gemv_engine_run_glu(&g->cfg, g->ctx, prepared, rows, x, y, ex);
}

static uint64_t cg_bytes(void *inst, const void *prepared) {
    (void)inst;
    return ((const gemv_matrix *)prepared)->bytes;
}

static const tsr_gemv_i cpu_gemv_iface = {
    .struct_size = sizeof(tsr_gemv_i),
    .version = TSR_GEMV_IFACE_VERSION,
    .prepare = cg_prepare,
    .release = cg_release,
    .run = cg_run,
    .bytes = cg_bytes,
    .prepare_group = cg_prepare_group,
    .run_glu = cg_run_glu,
};

static const tsr_plugin_desc cpu_gemv_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .name = "cpu_gemv",
    .slot = TSR_SLOT_GEMV,
    .version = "1.0.0",
    .instance_size = sizeof(cpu_gemv),
    .caps = TSR_CAP_DEVICE_CPU | TSR_CAP_EXACT,
    .init = cg_init,
    .fini = cg_fini,
    .iface = &cpu_gemv_iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *TSR_PLUGIN_ENTRY(void) { return &cpu_gemv_desc; }
