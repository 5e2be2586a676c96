/*
 * safetensors.h - a safetensors file read in place: the JSON header checked
 * against the file (header length <= 100 MB and within the file; valid JSON
 * without duplicate keys; known dtype; shape product * dtype size equal to
 * end - begin; offsets within the data section; tensors tiling it without
 * overlap or gaps; at most 4 dims) before any tensor is exposed. Tensors are
 * borrowed views into the buffer (an mmap for tsr_safetensors_open), sorted
 * by name. Data is not necessarily aligned: read it with memcpy or
 * tsr_dequant_row.
 *
 * dtypes: F32, F16, BF16, F8_E4M3, I8, I32, I64 (others are refused as
 * unsupported, naming the tensor).
 */
#ifndef TSR_SAFETENSORS_H
#define TSR_SAFETENSORS_H

#include <stdint.h>

#include "../util/error.h"
#include "model_file.h"

#define TSR_SAFETENSORS_MAX_HEADER (100u * 1000u * 1000u)

typedef struct tsr_safetensors tsr_safetensors;

/* Parse a safetensors image held in memory; buf must outlive the reader.
 * name is used in error messages (err->file). */
int tsr_safetensors_parse(const void *buf, uint64_t size, const char *name,
                          tsr_safetensors **out, tsr_error *err);
/* mmap path and parse it; the reader owns the mapping. */
int tsr_safetensors_open(const char *path, tsr_safetensors **out, tsr_error *err);
void tsr_safetensors_free(tsr_safetensors *st);

int tsr_safetensors_n_tensors(const tsr_safetensors *st);
/* i in [0, n): tensors sorted by name. */
const tsr_tensor *tsr_safetensors_tensor_at(const tsr_safetensors *st, int i);
/* NULL if absent. */
const tsr_tensor *tsr_safetensors_find(const tsr_safetensors *st, const char *name);
/* A string of the optional "__metadata__" object, NULL if absent or not a
 * string. */
const char *tsr_safetensors_metadata(const tsr_safetensors *st, const char *key);

/* Safetensors dtype spelling ("F32", "BF16", ...) of a tsr_dtype, NULL if the
 * format has none (quantised GGML types). */
const char *tsr_safetensors_dtype_name(uint32_t dtype);

/* Write n tensors (data and nbytes as given, in this order) to path, with
 * optional metadata: meta is NULL or a NULL-terminated list of key, value
 * pairs. Written to path.tmp and renamed. */
int tsr_safetensors_write(const char *path, const tsr_tensor *tensors, int n,
                          const char *const *meta, tsr_error *err);

#endif /* TSR_SAFETENSORS_H */
