/*
 * format_internal.h - pieces shared by the readers of core/format: file
 * mappings, the tensor table behind tsr_model_file, and the config fillers.
 * Not a public header.
 */
#ifndef TSR_FORMAT_INTERNAL_H
#define TSR_FORMAT_INTERNAL_H

#include <stdint.h>

#include "../util/error.h"
#include "gguf.h"
#include "model_config.h"
#include "model_file.h"

/* A read-only private mapping of a whole file. An empty file maps to
 * addr == NULL, size == 0 (the parsers then report it as too short). */
typedef struct tsr_map {
    void *addr;
    uint64_t size;
    int fd1; /* the file's descriptor + 1, kept for tsr_map_read (0: none, so a zeroed map owns nothing) */
} tsr_map;

int tsr_map_file(const char *path, tsr_map *m, tsr_error *err);
void tsr_map_release(tsr_map *m);
struct tsr_safetensors;
/* Give back the whole pages of [p, p + n) if the range lies inside m (see
 * tsr_model_file_give_back); returns the bytes given back, 0 otherwise. */
uint64_t tsr_map_give_back(const tsr_map *m, const void *p, uint64_t n);
/* Copy [p, p + n) into dst by reading the file (pread) when the range lies
 * inside m: the bytes of the mapping without mapping a page of it (see
 * tsr_model_file_read). 1 when done, 0 otherwise (dst untouched or partly
 * written: the caller copies from p instead). */
int tsr_map_read(const tsr_map *m, const void *p, uint64_t n, void *dst);
/* Whether [p, p + n) lies inside m. */
int tsr_map_holds(const tsr_map *m, const void *p, uint64_t n);
/* The mapping of the file a reader opened (empty for one parsed from a
 * buffer). */
const tsr_map *tsr_safetensors_map(const struct tsr_safetensors *st);
const tsr_map *tsr_gguf_map(const tsr_gguf *g);

/* A growable list of tensors with owned names, searchable by name once
 * sorted. */
typedef struct tsr_tensor_table {
    tsr_tensor *t;
    int n, cap;
} tsr_tensor_table;

/* Copies name; returns TSR_OK or TSR_ERR_NOMEM. */
int tsr_table_add(tsr_tensor_table *tab, const char *name, const tsr_tensor *t);
/* Sort by name; returns the first duplicate name or NULL. */
const char *tsr_table_sort(tsr_tensor_table *tab);
const tsr_tensor *tsr_table_find(const tsr_tensor_table *tab, const char *name);
void tsr_table_free(tsr_tensor_table *tab);

/* Fill cfg from a parsed config.json document (file names errors). */
struct json_t;
int tsr_config_from_json(const struct json_t *root, const char *file, tsr_model_config *cfg,
                         tsr_error *err);
/* Fill cfg from GGUF metadata and the tensors' presence. */
int tsr_config_from_gguf(const tsr_gguf *g, const char *file, tsr_model_config *cfg,
                         tsr_error *err);
/* Check every tensor the config implies is present with the right shape, and
 * set cfg->dtype from layer 0's q_proj. */
int tsr_config_check_tensors(tsr_model_config *cfg, const tsr_tensor_table *tab,
                             const char *file, tsr_error *err);

/* FP8 checkpoints (fp8_scales.c): check the scale companions in the sorted
 * tab against their F8_E4M3 weights and cfg's quantization_config, widen
 * them to f32 into *owned (one buffer, freed by the caller, also after a
 * failure; NULL when there are none) and set each weight's scale and scale_block. Refuses, naming the
 * tensor, every F8_E4M3 tensor without exactly one valid scale and, in a
 * checkpoint with FP8 weights or a quantization_config, every tensor that is
 * not a weight, a bias or a known companion. */
int tsr_fp8_scales_attach(tsr_tensor_table *tab, const tsr_model_config *cfg, const char *file,
                          float **owned, tsr_error *err);

/* Canonical tensor names from GGUF names: writes the HF name of a 2-D or 1-D
 * GGUF tensor into out (size bytes); returns 1 if mapped, 0 if the name is
 * not one we know. Merged expert tensors are handled by the caller. */
int tsr_gguf_name_to_hf(const char *gguf_name, tsr_arch arch, char *out, size_t size);
/* The reverse for dense tensors (no experts): 1 and the GGUF name in out, 0
 * for a name with none. */
int tsr_hf_name_to_gguf(const char *hf_name, char *out, size_t size);

#endif /* TSR_FORMAT_INTERNAL_H */
