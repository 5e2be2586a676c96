/*
 * model_file.h - a model checkpoint opened for reading: tensors as borrowed
 * views into memory maps, the architecture config, and where the tokenizer
 * lives.
 *
 * Formats: a Hugging Face folder (config.json + model.safetensors or
 * model.safetensors.index.json shards), a single .safetensors file whose
 * folder holds config.json, a GGUF v3 file, and a llama2.c .bin checkpoint.
 * Tensors are always found by their canonical Hugging Face names
 * ("model.layers.3.self_attn.q_proj.weight"); GGUF and llama2.c names are
 * mapped onto them, and GGUF's merged expert tensors are exposed as one
 * view per expert ("model.layers.0.mlp.experts.5.up_proj.weight").
 * Shapes are outermost first: a projection is [out_features, in_features].
 *
 * FP8 checkpoints (safetensors with F8_E4M3 projections and their scale
 * companions, docs/FORMATS.md): each scale is checked against its weight and
 * the config's quantization_config and attached to the weight's tsr_tensor;
 * the companions themselves stay in the table. Anything not understood is
 * refused, naming the tensor.
 */
#ifndef TSR_MODEL_FILE_H
#define TSR_MODEL_FILE_H

#include <stdint.h>

#include "../util/error.h"
#include "model_config.h"

typedef enum tsr_model_format {
    TSR_FORMAT_SAFETENSORS = 0,
    TSR_FORMAT_GGUF = 1,
    TSR_FORMAT_LLAMA2C = 2
} tsr_model_format;

typedef struct tsr_tensor {
    const char *name;     /* canonical name */
    uint32_t dtype;       /* tsr_dtype as stored */
    int n_dims;           /* 1..4 */
    int64_t shape[4];     /* outermost first */
    const void *data;     /* into the mmap; valid until tsr_model_file_close */
    uint64_t nbytes;
    /* An F8_E4M3 matrix of an FP8 checkpoint: its scale companion
     * (X.weight_scale or X.weight_scale_inv) widened to f32, owned by the
     * model file; value (r, c) = stored(r, c) * scale[(r / scale_block[0]) *
     * ceil(cols / scale_block[1]) + c / scale_block[1]] (tsr_weight_scale in
     * slots/tsr_gemv.h). NULL for every other tensor. */
    const float *scale;
    int64_t scale_block[2];
} tsr_tensor;

typedef struct tsr_model_file tsr_model_file;
struct tsr_gguf;

/* Open path (folder, .safetensors, .index.json, .gguf or llama2.c .bin),
 * validate every header, offset and size against the files, map the tensors
 * and fill the config. Errors name the file and the field. */
int tsr_model_file_open(const char *path, tsr_model_file **out, tsr_error *err);
void tsr_model_file_close(tsr_model_file *f);

const tsr_model_config *tsr_model_file_config(const tsr_model_file *f);
tsr_model_format tsr_model_file_format(const tsr_model_file *f);

/* NULL if absent. */
const tsr_tensor *tsr_model_file_tensor(const tsr_model_file *f, const char *name);
int tsr_model_file_n_tensors(const tsr_model_file *f);
const tsr_tensor *tsr_model_file_tensor_at(const tsr_model_file *f, int i);

/* Folder the model was read from (tokenizer.json, tokenizer_config.json). */
const char *tsr_model_file_dir(const tsr_model_file *f);
/* The path as given to open. */
const char *tsr_model_file_path(const tsr_model_file *f);

/* The GGUF reader behind a GGUF model (metadata for the tokenizer and chat
 * template), NULL for other formats. */
const struct tsr_gguf *tsr_model_file_gguf(const tsr_model_file *f);

/* Give the whole pages inside [p, p + n) back to the system when the range
 * lies inside one of f's file mappings (madvise MADV_DONTNEED on the
 * read-only private mapping: resident memory shrinks, and a later read of
 * those bytes faults the same bytes back in from the file). For a reader
 * that has made its own copy of a tensor. Returns the bytes given back; 0
 * when the range is not in a mapping of f (nothing is touched then). */
uint64_t tsr_model_file_give_back(const tsr_model_file *f, const void *p, uint64_t n);

/* Copy [p, p + n), bytes of a tensor of f, into dst by reading the file
 * rather than through the mapping: resident memory does not grow by the
 * pages around them (for the embedding lookup of a table whose pages were
 * given back: a kernel that caches the file in large folios maps up to 2 MiB
 * around each row touched). 1 when done; 0 when the range is not in a file
 * of f or the read failed (dst then undefined: copy from p). */
int tsr_model_file_read(const tsr_model_file *f, const void *p, uint64_t n, void *dst);

/* Total bytes of tensor data mapped. */
uint64_t tsr_model_file_bytes(const tsr_model_file *f);

#endif /* TSR_MODEL_FILE_H */
