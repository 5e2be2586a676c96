/* abl_sleep_drafter: proposes nothing and sleeps `sleep_ms` on every call:
 * output identical to drafter_none, only slower. ablate must attribute it a
 * negative share. For the ablation tests only. */
#include <time.h>

#include "slots/tsr_drafter.h"

typedef struct inst {
    long sleep_ns;
} inst;

static int dr_init(void *p, const tsr_plugin_ctx *ctx) {
    const tsr_param *t = ctx->host->param(ctx, "sleep_ms");
    ((inst *)p)->sleep_ns = (t ? (long)t->v.i : 10) * 1000000L;
    return TSR_OK;
}

static int dr_propose(void *p, const tsr_draft_req *r, tsr_draft_out *out) {
    (void)r;
    long ns = ((inst *)p)->sleep_ns;
    struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
    while (nanosleep(&ts, &ts)) {
    }
    out->n = 0;
    out->deterministic = 1;
    return TSR_OK;
}

static const tsr_drafter_i iface = {
    .struct_size = sizeof(tsr_drafter_i),
    .version = TSR_DRAFTER_IFACE_VERSION,
    .propose = dr_propose,
};

static const tsr_plugin_desc desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .name = "abl_sleep_drafter",
    .slot = TSR_SLOT_DRAFTER,
    .version = "0.1.0",
    .instance_size = sizeof(inst),
    .caps = TSR_CAP_DEVICE_CPU | TSR_CAP_EXACT,
    .init = dr_init,
    .iface = &iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *tsr_plugin_entry(void) { return &desc; }
