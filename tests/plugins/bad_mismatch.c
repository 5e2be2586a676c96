/* bad_mismatch: a gemv plugin the loader must refuse (descriptor version differs from the manifest). */
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

static int b_init(void *p, const tsr_plugin_ctx *ctx) {
    (void)p, (void)ctx;
    return TSR_OK;
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
    .name = "bad_mismatch",
    .slot = TSR_SLOT_GEMV,
    .version = "9.9.9",
    .instance_size = 16,
    .caps = TSR_CAP_DEVICE_CPU | TSR_CAP_EXACT,
    .init = b_init,
    .iface = &iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *tsr_plugin_entry(void) { return &desc; }
