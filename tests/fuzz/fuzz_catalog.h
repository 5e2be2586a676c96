/* fuzz_catalog.h - the small in-memory catalog the assembly harnesses check
 * against (fuzz_assembly.c: YAML; fuzz_lua_assembly.c: Lua): one plugin a
 * slot, with params, provides and requires for the checker to weigh; no
 * library is ever read (skip_files). */
#ifndef TSR_FUZZ_CATALOG_H
#define TSR_FUZZ_CATALOG_H

#include <stdlib.h>
#include <string.h>

#include "core/host/assembly.h"
#include "core/host/catalog.h"
#include "core/host/checker.h"
#include "core/host/diag.h"
#include "core/host/halloc.h"
#include "core/host/manifest.h"

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

/* The mixture-of-experts model the harnesses offer (the expert cache's requires). */
static tsr_model_config fuzz_moe(void) {
    tsr_model_config moe = {.n_experts = 8, .n_layers = 2};
    strcpy(moe.arch_name, "mixtral");
    return moe;
}

/* a checked against the catalog without a model, with a MoE model and (if
 * tests) with test plugins allowed: a passing plan must fill every slot. */
static void fuzz_check(tsr_assembly *a, int tests, tsr_diag *d) {
    const tsr_model_config moe = fuzz_moe();
    for (int pass = 0; pass < (tests ? 3 : 2); pass++) {
        tsr_check_opts o = {.model = pass == 1 ? &moe : NULL, .allow_test = pass == 2, .skip_files = 1};
        tsr_plan *p = NULL;
        if (tsr_check(&g_cat, a, &o, &p, d) == TSR_OK)
            for (int s = 0; s < TSR_SLOT_COUNT; s++)
                if (!p->slots[s].m) __builtin_trap();
        tsr_plan_free(p);
    }
}

/* Every message formatted, the diagnostics freed, and no host allocation
 * left of those made since live was read. */
static void fuzz_done(tsr_diag *d, uint64_t live) {
    char line[2048];
    for (int i = 0; i < d->n_errors; i++) tsr_error_format(&d->errors[i], line, sizeof line);
    tsr_diag_free(d);
    if (tsr_halloc_live() != live) __builtin_trap();
}

#endif /* TSR_FUZZ_CATALOG_H */
