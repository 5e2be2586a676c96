/* test_drafter: proposes nothing (speculation off); counts its calls. */
#include "slots/tsr_drafter.h"

typedef struct inst {
    int proposals, accepted;
} inst;

static int dr_init(void *p, const tsr_plugin_ctx *ctx) {
    (void)p;
    (void)ctx;
    return TSR_OK;
}

static int dr_propose(void *p, const tsr_draft_req *r, tsr_draft_out *out) {
    (void)r;
    ((inst *)p)->proposals++;
    out->n = 0;
    out->deterministic = 1;
    return TSR_OK;
}

static void dr_accept(void *p, int seq, int n_proposed, int n_accepted) {
    (void)seq;
    (void)n_proposed;
    ((inst *)p)->accepted += n_accepted;
}

static const tsr_drafter_i iface = {
    .struct_size = sizeof(tsr_drafter_i),
    .version = TSR_DRAFTER_IFACE_VERSION,
    .propose = dr_propose,
    .accept = dr_accept,
};

static const tsr_plugin_desc desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .name = "test_drafter",
    .slot = TSR_SLOT_DRAFTER,
    .version = "0.1.0",
    .instance_size = sizeof(inst),
    .caps = TSR_CAP_DEVICE_CPU | TSR_CAP_EXACT,
    .init = dr_init,
    .iface = &iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *tsr_plugin_entry(void) { return &desc; }
