/*
 * bad_plugin.c - gemv plugins the loader must refuse, one defect each,
 * built from this one source (BAD_NAME names the defect):
 *   bad_abi         descriptor built for ABI major 99
 *   bad_noentry     no tsr_plugin_entry symbol (a misspelt one instead)
 *   bad_nullmember  the required member run is NULL
 *   bad_mismatch    descriptor version 9.9.9 against the manifest's 1.0.0
 *   bad_init        init acquires memory, then fails with a message
 */
#include <string.h>

#include "slots/tsr_gemv.h"

#define IS(name) (!strcmp(BAD_NAME, name))

typedef struct inst {
    void *scratch;
} inst;

static int b_prepare(void *p, const tsr_weight *w, void **out) {
    (void)p;
    *out = (void *)w;
    return TSR_OK;
}

static int b_run(void *p, const void *prep, int rows, const float *x, float *y, const tsr_exec *ex) {
    (void)p, (void)prep, (void)rows, (void)x, (void)y, (void)ex;
    return TSR_OK;
}

static int b_init(void *p, const tsr_plugin_ctx *ctx) {
    if (!IS("bad_init")) return TSR_OK;
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

static tsr_gemv_i iface = {
    .struct_size = sizeof(tsr_gemv_i),
    .version = TSR_GEMV_IFACE_VERSION,
    .prepare = b_prepare,
    .run = b_run,
};

static tsr_plugin_desc desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .name = BAD_NAME,
    .slot = TSR_SLOT_GEMV,
    .version = "1.0.0",
    .instance_size = sizeof(inst),
    .caps = TSR_CAP_DEVICE_CPU | TSR_CAP_EXACT,
    .init = b_init,
    .fini = b_fini,
    .iface = &iface,
};

static const tsr_plugin_desc *entry(void) {
    if (IS("bad_abi")) desc.abi_major = 99;
    if (IS("bad_nullmember")) iface.run = NULL;
    if (IS("bad_mismatch")) desc.version = "9.9.9";
    return &desc;
}

#ifdef BAD_NO_ENTRY
TSR_PLUGIN_EXPORT const tsr_plugin_desc *tsr_plugin_entry_misspelt(void) { return entry(); }
#else
TSR_PLUGIN_EXPORT const tsr_plugin_desc *tsr_plugin_entry(void) { return entry(); }
#endif
