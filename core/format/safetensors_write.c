#include "safetensors_write.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/checked.h"

int tsr_safetensors_write(const char *path, const tsr_st_out *t, int n, tsr_error *err) {
    char header[8192];
    size_t hl = 0;
    uint64_t off = 0;
    hl += (size_t)snprintf(header + hl, sizeof header - hl, "{");
    for (int i = 0; i < n; i++) {
        uint64_t elems;
        if (t[i].dtype != TSR_DTYPE_F32 && t[i].dtype != TSR_DTYPE_I32)
            return tsr_error_set(err, TSR_ERR_UNSUPPORTED, "%s: only F32 and I32 are written", t[i].name);
        if (tsr_dims_product(t[i].shape, t[i].n_dims, &elems) != 0 || tsr_mul_u64(elems, 4, &elems))
            return tsr_error_set(err, TSR_ERR_INVALID, "%s: shape overflows", t[i].name);
        hl += (size_t)snprintf(header + hl, sizeof header - hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                               i ? "," : "", t[i].name, t[i].dtype == TSR_DTYPE_F32 ? "F32" : "I32");
        for (int d = 0; d < t[i].n_dims; d++)
            hl += (size_t)snprintf(header + hl, sizeof header - hl, "%s%lld", d ? "," : "",
                                   (long long)t[i].shape[d]);
        hl += (size_t)snprintf(header + hl, sizeof header - hl, "],\"data_offsets\":[%llu,%llu]}",
                               (unsigned long long)off, (unsigned long long)(off + elems));
        off += elems;
        if (hl >= sizeof header - 64) return tsr_error_set(err, TSR_ERR_RANGE, "header too large");
    }
    hl += (size_t)snprintf(header + hl, sizeof header - hl, "}");
    while (hl % 8) header[hl++] = ' '; /* align the data section */
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return tsr_error_set_at(err, TSR_ERR_IO, path, 0, 0, "cannot write: %s", strerror(errno));
    uint64_t hl64 = hl;
    int ok = fwrite(&hl64, 8, 1, f) == 1 && fwrite(header, 1, hl, f) == hl;
    for (int i = 0; ok && i < n; i++) {
        uint64_t elems = 0;
        tsr_dims_product(t[i].shape, t[i].n_dims, &elems);
        ok = fwrite(t[i].data, 4, elems, f) == elems;
    }
    if (fclose(f) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return tsr_error_set_at(err, TSR_ERR_IO, path, 0, 0, "write failed: %s", strerror(errno));
    }
    return TSR_OK;
}
