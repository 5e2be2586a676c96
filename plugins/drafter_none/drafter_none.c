/*
 * drafter_none - the baseline drafter: proposes nothing, so every step of
 * generation is one plain decode row.
 */
#include "slots/tsr_drafter.h"

typedef struct drafter_none {
    int unused;
} drafter_none;

static int none_init(void *inst, const tsr_plugin_ctx *ctx) {
    (void)inst;
    (void)ctx;
    return TSR_OK;
}

static int none_propose(void *inst, const tsr_draft_req *r, tsr_draft_out *out) {
    (void)inst;
    (void)r;
    out->n = 0;
    out->deterministic = 1;
    return TSR_OK;
}

static const tsr_drafter_i none_iface = {
    .struct_size = sizeof(tsr_drafter_i),
    .version = TSR_DRAFTER_IFACE_VERSION,
    .propose = none_propose,
    .accept = NULL,
    .seq_end = NULL,
};

static const tsr_plugin_desc none_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .name = "drafter_none",
    .slot = TSR_SLOT_DRAFTER,
    .version = "1.0.0",
    .instance_size = sizeof(drafter_none),
    .caps = TSR_CAP_DEVICE_CPU | TSR_CAP_DEVICE_CUDA | TSR_CAP_EXACT,
    .init = none_init,
    .fini = NULL,
    .iface = &none_iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *TSR_PLUGIN_ENTRY(void) { return &none_desc; }
