/* libFuzzer harness: the GGUF reader on arbitrary bytes, then every query
 * on whatever it accepted. */
#include <stddef.h>
#include <stdint.h>

#include "core/format/format_internal.h"
#include "core/format/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tsr_gguf *g = NULL;
    tsr_error err;
    if (tsr_gguf_parse(data, size, "fuzz.gguf", &g, &err) != TSR_OK) return 0;
    volatile uint64_t sink = 0;
    for (int i = 0; i < tsr_gguf_n_kv(g); i++) {
        int64_t iv;
        double fv;
        int bv;
        uint64_t len, n;
        tsr_gguf_type et;
        const void *arr;
        sink += (uint64_t)tsr_gguf_find(g, tsr_gguf_key(g, i));
        if (tsr_gguf_get_int(g, i, &iv) == 0) sink += (uint64_t)iv;
        if (tsr_gguf_get_float(g, i, &fv) == 0) sink += (uint64_t)(fv == fv);
        if (tsr_gguf_get_bool(g, i, &bv) == 0) sink += (uint64_t)bv;
        const char *s = tsr_gguf_get_str(g, i, &len);
        if (s && len) sink += (uint8_t)s[len - 1];
        if (tsr_gguf_get_arr(g, i, &et, &n, &arr) == 0 && n && et == TSR_GGUF_STRING) {
            for (uint64_t k = 0; k < n && k < 64; k++) {
                const char *e = tsr_gguf_get_arr_str(g, i, k, &len);
                if (e && len) sink += (uint8_t)e[len - 1];
            }
        }
    }
    for (int i = 0; i < tsr_gguf_n_tensors(g); i++) {
        const tsr_gguf_tensor_info *t = tsr_gguf_tensor(g, i);
        sink += (uint64_t)tsr_gguf_find_tensor(g, t->name);
        if (t->nbytes) sink += ((const uint8_t *)t->data)[t->nbytes - 1];
    }
    /* the model-level reading of the metadata: config and tensor names */
    tsr_model_config cfg;
    if (tsr_config_from_gguf(g, "fuzz.gguf", &cfg, &err) == TSR_OK) {
        sink += (uint64_t)cfg.n_layers;
        for (int i = 0; i < tsr_gguf_n_tensors(g); i++) {
            char name[192];
            sink += (uint64_t)tsr_gguf_name_to_hf(tsr_gguf_tensor(g, i)->name, cfg.arch, name,
                                                  sizeof name);
        }
    }
    (void)sink;
    tsr_gguf_free(g);
    return 0;
}
