/* libFuzzer harness: a Lua assembly script from memory, run in the sandbox
 * with a small instruction budget and memory cap, its table converted and
 * validated, then checked against fuzz_catalog.h's in-memory catalog with and
 * without a model; any leak of the host's allocations fails it. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/host/assembly.h"
#include "core/host/checker.h"
#include "core/host/diag.h"
#include "core/host/halloc.h"
#include "core/host/lua_assembly.h"

#include "tests/fuzz/fuzz_catalog.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_cat.n) init_catalog();
    uint64_t live = tsr_halloc_live();
    tsr_diag d;
    tsr_diag_init(&d);
    const tsr_model_config moe = fuzz_moe();
    /* the model the script sees (tessera.model) alternates with the input's first byte */
    tsr_assembly_env env = {.catalog = &g_cat,
                            .model = size && (data[0] & 1) ? &moe : NULL,
                            .device = TSR_DEVICE_CPU,
                            .lua_instructions = 200000,
                            .lua_memory = 4u << 20};
    tsr_ynode *root = NULL;
    tsr_assembly *a = NULL;
    if (tsr_lua_assembly_run_buffer((const char *)data, size, "/fuzz/a.lua", &env, &root, &d) == TSR_OK &&
        tsr_assembly_from_tree(root, "/fuzz/a.lua", &a, &d) == TSR_OK) {
        fuzz_check(a, 0, &d);
        tsr_assembly_free(a);
    }
    fuzz_done(&d, live);
    return 0;
}
