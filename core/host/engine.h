/*
 * engine.h - an assembled engine: one loaded, initialised plugin per slot.
 *
 * This is the face the host runtime shows to the model runtime, the CLI and
 * the server. Everything before it (catalog of manifests, assembly parsing,
 * checking) lives in catalog.h, assembly.h and checker.h; tsr_engine_open
 * runs that whole path for the common case.
 */
#ifndef TSR_ENGINE_H
#define TSR_ENGINE_H

#include "../../slots/tsr_attention.h"
#include "../../slots/tsr_drafter.h"
#include "../../slots/tsr_expert_cache.h"
#include "../../slots/tsr_gemv.h"
#include "../../slots/tsr_kv_cache.h"
#include "../../slots/tsr_plugin.h"
#include "../format/model_config.h"
#include "../util/error.h"
#include "../util/threadpool.h"

typedef struct tsr_engine tsr_engine;

typedef struct tsr_engine_opts {
    const char *catalog_dir; /* NULL: $TESSERA_CATALOG, else <exe dir>/../catalog */
    int n_threads;           /* 0: every online core */
    int device_id;           /* CUDA ordinal */
    /* appended by the host runtime: */
    int allow_test;          /* test plugins may be assembled (tests only) */
    int no_init;             /* check, load and cross-check every plugin but do not
                              * allocate instances or call init (tessera check without
                              * a model): slots then have iface but inst == NULL */
} tsr_engine_opts;

/* One slot of a loaded engine. */
typedef struct tsr_slot_ref {
    tsr_slot slot;
    const char *plugin;          /* plugin name */
    const char *version;
    const void *iface;           /* the slot's interface table, version-checked */
    void *inst;                  /* the plugin's instance */
    const tsr_plugin_ctx *ctx;
    int exact;                   /* manifest exactness: 1 exact, 0 lossy */
    int baseline;                /* it is its slot's baseline for the device */
    int graph;                   /* manifest provides cuda_graph: true (tsr_exec.step) */
} tsr_slot_ref;

/* Load the catalog, read the assembly (YAML or Lua; Lua sees the model's
 * config), check it against the catalog and the model, then dlopen and init
 * every plugin. Nothing is loaded unless the whole check passes. On failure
 * err holds the first problem and, in its message, how many there were. */
int tsr_engine_open(const char *assembly_path, const tsr_model_config *cfg,
                    const tsr_model_desc *desc, const tsr_engine_opts *opts, tsr_engine **out,
                    tsr_error *err);
void tsr_engine_free(tsr_engine *e);

struct tsr_diag;
/* The same, collecting every problem in d (see diag.h) instead of the first. */
int tsr_engine_open_diag(const char *assembly_path, const tsr_model_config *cfg,
                         const tsr_model_desc *desc, const tsr_engine_opts *opts, tsr_engine **out,
                         struct tsr_diag *d);

const tsr_slot_ref *tsr_engine_slot(const tsr_engine *e, tsr_slot slot);
tsr_threadpool *tsr_engine_pool(const tsr_engine *e);
int tsr_engine_device(const tsr_engine *e);   /* tsr_device_kind */
int tsr_engine_runtime(const tsr_engine *e, int s); /* the assembly's runtime switch s (tsr_rt_switch, assembly.h) */
const char *tsr_engine_name(const tsr_engine *e); /* the assembly's name */
/* Print the resolved engine (slot, plugin, version, params, capabilities,
 * exactness), one slot per line, as `tessera check` does. */
void tsr_engine_describe(const tsr_engine *e, FILE *f);

/* Bytes of host (and device) memory plugins hold through the host's
 * allocator. */
uint64_t tsr_engine_host_bytes(const tsr_engine *e);

/* Models the runtime lends plugins through tsr_host_api version 2 (and the
 * pages of its model file they give back, version 3): each
 * member takes the runtime's data first, then the host member's arguments.
 * Until tsr_engine_set_aux is called those host members answer
 * TSR_ERR_UNSUPPORTED. */
typedef struct tsr_aux_api {
    void *data;
    int (*model_open)(void *data, const tsr_plugin_ctx *ctx, const char *path, const char *assembly,
                      int n_layers, tsr_aux_model **out);
    void (*model_close)(void *data, tsr_aux_model *m);
    int (*model_dims)(void *data, const tsr_aux_model *m, int *vocab, int *max_ctx);
    int (*seq_open)(void *data, const tsr_plugin_ctx *ctx, tsr_aux_model *m, int max_tokens,
                    tsr_aux_seq **out);
    void (*seq_close)(void *data, tsr_aux_seq *s);
    int (*seq_forward)(void *data, const tsr_plugin_ctx *ctx, tsr_aux_seq *s, const int32_t *tokens,
                       int n, float *logits);
    int (*seq_truncate)(void *data, const tsr_plugin_ctx *ctx, tsr_aux_seq *s, int n_tokens);
    /* tsr_host_api version 3: give back the pages of the model file under
     * [p, p + n) (weight_done); NULL: never (the host member answers 0). */
    uint64_t (*weight_done)(void *data, const void *p, uint64_t n);
} tsr_aux_api;

/* Lend models to the engine's plugins (api borrowed; NULL withdraws it). */
void tsr_engine_set_aux(tsr_engine *e, const tsr_aux_api *api);

/* The text of the last error a plugin reported through set_error (or ""). */
const char *tsr_engine_plugin_error(const tsr_engine *e, tsr_slot slot);

#endif /* TSR_ENGINE_H */
