/*
 * safetensors_write.h - writing float32 / int32 tensors to a .safetensors
 * file (used by `tessera score` for its logits).
 */
#ifndef TSR_SAFETENSORS_WRITE_H
#define TSR_SAFETENSORS_WRITE_H

#include <stdint.h>

#include "../util/error.h"

typedef struct tsr_st_out {
    const char *name;
    uint32_t dtype;      /* TSR_DTYPE_F32 or TSR_DTYPE_I32 */
    int n_dims;
    int64_t shape[4];
    const void *data;
} tsr_st_out;

/* Write n tensors to path (replacing it atomically through path.tmp). */
int tsr_safetensors_write(const char *path, const tsr_st_out *t, int n, tsr_error *err);

#endif
