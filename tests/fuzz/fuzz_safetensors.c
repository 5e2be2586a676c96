/* libFuzzer harness: the safetensors reader on arbitrary bytes, then every
 * tensor it accepted, read at both ends. */
#include <stddef.h>
#include <stdint.h>

#include "core/format/safetensors.h"
#include "kernels/dtype.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tsr_safetensors *st = NULL;
    tsr_error err;
    if (tsr_safetensors_parse(data, size, "fuzz.safetensors", &st, &err) != TSR_OK) return 0;
    volatile uint64_t sink = 0;
    for (int i = 0; i < tsr_safetensors_n_tensors(st); i++) {
        const tsr_tensor *t = tsr_safetensors_tensor_at(st, i);
        sink += tsr_safetensors_find(st, t->name) == t;
        if (t->nbytes) {
            const uint8_t *p = t->data;
            sink += p[0] + p[t->nbytes - 1];
            float v[1];
            tsr_dequant_row(t->dtype, p, v, 1);
            sink += v[0] == v[0];
        }
    }
    sink += tsr_safetensors_metadata(st, "format") != NULL;
    (void)sink;
    tsr_safetensors_free(st);
    return 0;
}
