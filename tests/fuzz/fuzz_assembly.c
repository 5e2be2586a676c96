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

#include "tests/fuzz/fuzz_catalog.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_cat.n) init_catalog();
    uint64_t live = tsr_halloc_live();
    tsr_diag d;
    tsr_diag_init(&d);
    tsr_assembly *a = NULL;
    if (tsr_assembly_parse((const char *)data, size, "/fuzz/a.yaml", &a, &d) == TSR_OK) {
        fuzz_check(a, 1, &d);
        tsr_assembly_free(a);
    }
    fuzz_done(&d, live);
    return 0;
}
