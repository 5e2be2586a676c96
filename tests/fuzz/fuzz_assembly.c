/* libFuzzer harness: a YAML assembly from memory, validated and then checked
 * against a small fixed in-memory catalog (skip_files: no library is read),
 * with and without a model. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/host/assembly.h"
#include "core/host/checker.h"
#include "core/host/diag.h"
#include "core/host/halloc.h"

#define SHA "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define HEAD(n, s) "name: " n "\nslot: " s "\nversion: 1.0.0\nabi: \"1.0\"\nlibrary: lib" n ".so\nsha256: \"" SHA "\"\n"

static const char *const manifests[] = {
    HEAD("kv", "kv_cache") "devices: [cpu]\nexactness: exact\nbaseline: [cpu]\n"
                           "provides: {kv_dtype: $dtype, kv_layout: contiguous, block: $block}\n"
                           "params: {dtype: {type: string, default: f32, values: [f32, f16]},"
                           " block: {type: int, default: 16, min: 1, max: 256}}\n",
    HEAD("att", "attention") "devices: [cpu, cuda]\nexactness: lossy\nbaseline: [cpu]\n"
                             "quality: {max_mean_kl: 0.1, max_ppl_ratio: 1.1}\n"
                             "requires: {kv_cache.kv_dtype: [f32, f16], kv_cache.block: 16, device: cpu}\n"
                             "params: {scale: {type: float, default: 1, min: 0, max: 2}, on: {type: bool, default: true}}\n",
    HEAD("gemv", "gemv") "devices: [cpu]\nexactness: exact\nbaseline: [cpu]\ntest: true\n",
    HEAD("dr", "drafter") "devices: [cpu]\nexactness: exact\nbaseline: [cpu]\n",
    HEAD("ec", "expert_cache") "devices: [cpu]\nexactness: exact\nbaseline: [cpu]\n"
                               "requires: {model.moe: true, model.arch: [mixtral, qwen3_moe]}\n",
};

static tsr_catalog g_cat;

static void init_catalog(void) {
    size_t n = sizeof manifests / sizeof manifests[0];
    g_cat.dir = "<fuzz>";
    g_cat.items = calloc(n, sizeof *g_cat.items);
    tsr_diag d;
    tsr_diag_init(&d);
    for (size_t i = 0; i < n; i++) {
        tsr_manifest *m = NULL;
        if (tsr_manifest_parse(manifests[i], strlen(manifests[i]), "/fuzz/m.yaml", &m, &d)) abort();
        g_cat.items[g_cat.n++] = m;
    }
    tsr_diag_free(&d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_cat.n) init_catalog();
    uint64_t live = tsr_halloc_live();
    tsr_diag d;
    tsr_diag_init(&d);
    tsr_assembly *a = NULL;
    if (tsr_assembly_parse((const char *)data, size, "/fuzz/a.yaml", &a, &d) == TSR_OK) {
        tsr_model_config moe = {.n_experts = 8, .n_layers = 2};
        strcpy(moe.arch_name, "mixtral");
        for (int pass = 0; pass < 3; pass++) {
            tsr_check_opts o = {.model = pass == 1 ? &moe : NULL, .allow_test = pass == 2, .skip_files = 1};
            tsr_plan *p = NULL;
            if (tsr_check(&g_cat, a, &o, &p, &d) == TSR_OK) {
                for (int s = 0; s < TSR_SLOT_COUNT; s++)
                    if (!p->slots[s].m) __builtin_trap(); /* a passing plan fills every slot */
            }
            tsr_plan_free(p);
        }
        tsr_assembly_free(a);
    }
    char line[2048];
    for (int i = 0; i < d.n_errors; i++) tsr_error_format(&d.errors[i], line, sizeof line);
    tsr_diag_free(&d);
    if (tsr_halloc_live() != live) __builtin_trap();
    return 0;
}
