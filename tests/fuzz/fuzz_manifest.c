/* libFuzzer harness: a manifest from memory (YAML tree, schema, every check
 * that needs no library file). Any crash, leak or sanitizer report is a bug. */
#include <stddef.h>
#include <stdint.h>

#include "core/host/diag.h"
#include "core/host/halloc.h"
#include "core/host/manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tsr_diag d;
    tsr_diag_init(&d);
    tsr_manifest *m = NULL;
    if (tsr_manifest_parse((const char *)data, size, "/fuzz/m.yaml", &m, &d) == TSR_OK) {
        /* touch what the checker reads */
        for (int i = 0; i < m->n_params; i++) {
            char buf[64];
            tsr_param_format(&m->params[i].def, buf, sizeof buf);
        }
        for (int i = 0; i < m->n_exports; i++) {
            char buf[256];
            tsr_ffi_sig_format(&m->exports[i].sig, buf, sizeof buf);
        }
        tsr_manifest_free(m);
    } else if (m) {
        __builtin_trap(); /* a failed parse must not hand back a manifest */
    }
    char line[2048];
    for (int i = 0; i < d.n_errors; i++) tsr_error_format(&d.errors[i], line, sizeof line);
    tsr_diag_free(&d);
    if (tsr_halloc_live() != 0) __builtin_trap(); /* everything allocated was freed */
    return 0;
}
