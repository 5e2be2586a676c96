/* libFuzzer harness (TESSERA_FUZZ=ON): bench's untrusted inputs. The first
 * byte picks the parser: even, the SSE parser fed in pieces whose sizes come
 * from the input; odd, the workload parser. Neither may crash, and every
 * event must be NUL-terminated at its stated length. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ablation/sse.h"
#include "ablation/workload.h"

static int on_event(void *ud, const char *type, const char *data, size_t len) {
    (void)ud;
    if (data[len] != 0 || strlen(type) >= 64) abort();
    return len == 4 && !memcmp(data, "stop", 4); /* exercise the early stop */
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    if (n < 1) return 0;
    tsr_error err;
    tsr_error_clear(&err);
    if (d[0] & 1) {
        tsr_workload *w = NULL;
        if (tsr_workload_parse((const char *)d + 1, n - 1, "fuzz.json", &w, &err) == TSR_OK) {
            if (!w || w->n_cases < 1 || w->repeats < 1) abort();
            for (int i = 0; i < w->n_cases; i++)
                if (w->cases[i].max_tokens < 1 || !w->cases[i].messages) abort();
        } else if (w)
            abort();
        tsr_workload_free(w);
        return 0;
    }
    tsr_sse p;
    tsr_sse_init(&p, on_event, NULL);
    size_t off = 1, step = (size_t)(d[0] >> 1) + 1;
    while (off < n) {
        size_t k = n - off < step ? n - off : step;
        if (tsr_sse_feed(&p, (const char *)d + off, k, &err) != TSR_OK) break;
        off += k;
    }
    tsr_sse_free(&p);
    return 0;
}
