/* bad_drafter - proposes the id one past the vocabulary's end (a planted
 * defect for the harness's own test). */
#include "slots/tsr_drafter.h"

typedef struct bad {
    const tsr_plugin_ctx *ctx;
} bad;

static int bad_init(void *inst, const tsr_plugin_ctx *ctx) {
    ((bad *)inst)->ctx = ctx;
    return TSR_OK;
}

static int bad_propose(void *inst, const tsr_draft_req *r, tsr_draft_out *out) {
    bad *b = inst;
    out->n = r->max_draft > 0 ? 1 : 0;
    if (out->n) out->tokens[0] = b->ctx->model->vocab;
    out->deterministic = 1;
    return TSR_OK;
}

static const tsr_drafter_i bad_iface = {
    .struct_size = sizeof(tsr_drafter_i),
    .version = TSR_DRAFTER_IFACE_VERSION,
    .propose = bad_propose,
};

static const tsr_plugin_desc bad_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .name = "bad_drafter_ids",
    .slot = TSR_SLOT_DRAFTER,
    .version = "0.0.1",
    .instance_size = sizeof(bad),
    .caps = TSR_CAP_DEVICE_CPU | TSR_CAP_EXACT,
    .init = bad_init,
    .iface = &bad_iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *TSR_PLUGIN_ENTRY(void) { return &bad_desc; }
