/*
 * gguf.h - GGUF v3 reader: header, metadata and tensor infos, each size and
 * offset checked against the file before use (llama.cpp's CVE history is the
 * list of checks: counts, string lengths, array lengths, dims, types,
 * alignment, offsets, overlap).
 */
#ifndef TSR_GGUF_H
#define TSR_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "../util/error.h"

/* GGUF metadata value types (gguf_type). */
typedef enum tsr_gguf_type {
    TSR_GGUF_UINT8 = 0, TSR_GGUF_INT8 = 1, TSR_GGUF_UINT16 = 2, TSR_GGUF_INT16 = 3,
    TSR_GGUF_UINT32 = 4, TSR_GGUF_INT32 = 5, TSR_GGUF_FLOAT32 = 6, TSR_GGUF_BOOL = 7,
    TSR_GGUF_STRING = 8, TSR_GGUF_ARRAY = 9, TSR_GGUF_UINT64 = 10, TSR_GGUF_INT64 = 11,
    TSR_GGUF_FLOAT64 = 12
} tsr_gguf_type;

typedef struct tsr_gguf_tensor_info {
    const char *name;       /* GGUF name, e.g. "blk.0.attn_q.weight" */
    uint32_t ggml_type;     /* GGML type id as stored */
    uint32_t dtype;         /* tsr_dtype, or TSR_DTYPE_COUNT if unsupported */
    int n_dims;
    int64_t ne[4];          /* GGML order: ne[0] is the innermost (contiguous) dim */
    uint64_t offset;        /* from the start of the file */
    uint64_t nbytes;
    const void *data;
} tsr_gguf_tensor_info;

typedef struct tsr_gguf tsr_gguf;

/* Parse a GGUF file held in memory (buf must outlive the reader; usually an
 * mmap). name is used in error messages. */
int tsr_gguf_parse(const void *buf, uint64_t size, const char *name, tsr_gguf **out,
                   tsr_error *err);
/* mmap path and parse it; the reader owns the mapping. */
int tsr_gguf_open(const char *path, tsr_gguf **out, tsr_error *err);
void tsr_gguf_free(tsr_gguf *g);

int tsr_gguf_n_kv(const tsr_gguf *g);
/* Index of key, -1 if absent. */
int tsr_gguf_find(const tsr_gguf *g, const char *key);
const char *tsr_gguf_key(const tsr_gguf *g, int idx);
tsr_gguf_type tsr_gguf_kv_type(const tsr_gguf *g, int idx);

/* Scalar getters: 0 on success, -1 if idx < 0 or the type does not convert
 * (integers convert between widths when the value fits; floats widen). */
int tsr_gguf_get_int(const tsr_gguf *g, int idx, int64_t *out);
int tsr_gguf_get_float(const tsr_gguf *g, int idx, double *out);
int tsr_gguf_get_bool(const tsr_gguf *g, int idx, int *out);
/* Not NUL-terminated in the file: returns a pointer and the length. */
const char *tsr_gguf_get_str(const tsr_gguf *g, int idx, uint64_t *len);

/* Arrays: element type and count; numeric elements are contiguous at *data
 * (little-endian, packed); string elements through tsr_gguf_get_arr_str. */
int tsr_gguf_get_arr(const tsr_gguf *g, int idx, tsr_gguf_type *elem_type, uint64_t *n,
                     const void **data);
const char *tsr_gguf_get_arr_str(const tsr_gguf *g, int idx, uint64_t i, uint64_t *len);

int tsr_gguf_n_tensors(const tsr_gguf *g);
const tsr_gguf_tensor_info *tsr_gguf_tensor(const tsr_gguf *g, int i);
/* Index of a tensor by GGUF name, -1 if absent. */
int tsr_gguf_find_tensor(const tsr_gguf *g, const char *name);

#endif /* TSR_GGUF_H */
