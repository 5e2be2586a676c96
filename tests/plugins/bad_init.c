/* bad_init: a gemv plugin the loader must refuse (init fails with a message). */
#include "slots/tsr_gemv.h"

static int b_prepare(void *p, const tsr_weight *w, void **out) {
    (void)p;
    *out = (void *)w;
    return TSR_OK;
}

static int b_run(void *p, const void *prep, int rows, const float *x, float *y, const tsr_exec *ex) {
    (void)p, (void)prep, (void)rows, (void)x, (void)y, (void)ex;
    return TSR_OK;
}

typedef struct inst {
    void *scratch;
} inst;

static int b_init(void *p, const tsr_plugin_ctx *ctx) {
    inst *b = p;
    /* acquire something first, so fini has to clean up after a failed init */
    b->scratch = ctx->host->alloc(ctx, 4096, 64);
    const tsr_param *t = ctx->host->param(ctx, "threads");
    ctx->host->set_error(ctx, "deliberate failure (threads=%lld)", t ? (long long)t->v.i : -1LL);
    return TSR_ERR_PLUGIN;
}

static void b_fini(void *p) {
    (void)p; /* leaves scratch to the host: it frees what a plugin forgets */
}

static const tsr_gemv_i iface = {
    .struct_size = sizeof(tsr_gemv_i),
    .version = TSR_GEMV_IFACE_VERSION,
    .prepare = b_prepare,
    .run = b_run,
};

static const tsr_plugin_desc desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .name = "bad_init",
    .slot = TSR_SLOT_GEMV,
    .version = "1.0.0",
    .instance_size = sizeof(inst),
    .caps = TSR_CAP_DEVICE_CPU | TSR_CAP_EXACT,
    .init = b_init,
    .fini = b_fini,
    .iface = &iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *tsr_plugin_entry(void) { return &desc; }
