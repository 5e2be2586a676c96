/*
 * cpu_gemv - SIMD gemv over the weights exactly as stored.
 *
 * prepare() only checks the matrix and keeps a borrowed view of the mmap:
 * f32/f16/bf16/i8 are converted in registers, GGUF Q8_0 and Q4_K blocks are
 * decoded in registers, the other block types 256 elements at a time on the
 * stack; no copy of the matrix is ever made. run() splits the output rows
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
} cpu_gemv;

static int cg_init(void *inst, const tsr_plugin_ctx *ctx) {
    cpu_gemv *g = inst;
    g->ctx = ctx;
    return gemv_engine_init(&g->cfg, ctx);
}

static int cg_prepare(void *inst, const tsr_weight *w, void **out) {
    cpu_gemv *g = inst;
    uint64_t row_bytes;
    int rc = gemv_engine_check(g->ctx, w, &row_bytes);
    if (rc != TSR_OK) return rc;
    gemv_matrix *m = g->ctx->host->alloc(g->ctx, sizeof *m, 16);
    if (!m) {
        g->ctx->host->set_error(g->ctx, "%s: out of memory", w->name ? w->name : "(unnamed)");
        return TSR_ERR_NOMEM;
    }
    m->dtype = w->dtype;
    m->rows = w->rows;
    m->cols = w->cols;
    m->row_bytes = row_bytes;
    m->data = w->data;
    m->scale = NULL;
    m->bytes = row_bytes * (uint64_t)w->rows;
    m->owned = NULL;
    m->x_i16 = 0;
    *out = m;
    return TSR_OK;
}

static void cg_release(void *inst, void *prepared) {
    cpu_gemv *g = inst;
    g->ctx->host->free(g->ctx, prepared);
}

static int cg_run(void *inst, const void *prepared, int rows, const float *x, float *y, const tsr_exec *ex) {
    cpu_gemv *g = inst;
    return gemv_engine_run(&g->cfg, g->ctx, prepared, rows, x, y, ex);
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
    .fini = NULL,
    .iface = &cpu_gemv_iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *TSR_PLUGIN_ENTRY(void) { return &cpu_gemv_desc; }
