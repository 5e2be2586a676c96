/*
 * tsr_plugin.h - the plugin ABI shared by the host and every plugin.
 *
 * A plugin is a shared object exporting exactly one symbol, TSR_PLUGIN_ENTRY
 * ("tsr_plugin_entry"), a function returning a const tsr_plugin_desc. The host
 * allocates the instance (desc->instance_size bytes, zeroed), calls init(), and
 * from then on calls the slot interface (desc->iface) through the wrappers in
 * core/host. Plugins never link against the host: everything they need from it
 * comes through the tsr_host_api table reachable from their tsr_plugin_ctx.
 *
 * Versioning: the ABI major must match exactly, the host accepts any minor
 * <= its own. Interface tables start with struct_size and version; members
 * are only ever appended, and the host checks struct_size before touching a
 * member newer than version 1.
 *
 * Shapes are written [outer, inner]; all activations crossing a slot are f32
 * and live on the device named in tsr_exec (host memory for TSR_DEVICE_CPU).
 */
#ifndef TSR_PLUGIN_H
#define TSR_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TSR_ABI_MAJOR 1
#define TSR_ABI_MINOR 2

#define TSR_PLUGIN_ENTRY_NAME "tsr_plugin_entry"
#define TSR_PLUGIN_EXPORT __attribute__((visibility("default")))

/* Status codes returned by every fallible call, host or plugin. */
typedef enum tsr_status {
    TSR_OK = 0,
    TSR_ERR_INVALID = -1,         /* bad argument or bad input */
    TSR_ERR_NOMEM = -2,           /* allocation failed */
    TSR_ERR_IO = -3,              /* open/read/mmap failed */
    TSR_ERR_FORMAT = -4,          /* malformed file or document */
    TSR_ERR_UNSUPPORTED = -5,     /* well-formed, but not supported here */
    TSR_ERR_NOT_IMPLEMENTED = -6, /* a declared member that does nothing yet */
    TSR_ERR_REFUSED = -7,         /* checker or loader refused */
    TSR_ERR_PLUGIN = -8,          /* a plugin call failed */
    TSR_ERR_RANGE = -9,           /* out of capacity: context full, budget too small */
    TSR_ERR_DEVICE = -10,         /* device (CUDA) error */
    TSR_ERR_CANCELLED = -11       /* the caller asked to stop */
} tsr_status;

/* Slots, in the order the assembly lists them. */
typedef enum tsr_slot {
    TSR_SLOT_ATTENTION = 0,
    TSR_SLOT_KV_CACHE = 1,
    TSR_SLOT_DRAFTER = 2,
    TSR_SLOT_EXPERT_CACHE = 3,
    TSR_SLOT_GEMV = 4,
    TSR_SLOT_COUNT = 5
} tsr_slot;

typedef enum tsr_device_kind {
    TSR_DEVICE_CPU = 0,
    TSR_DEVICE_CUDA = 1
} tsr_device_kind;

/* Element types of stored tensors and KV entries. Block-quantised types
 * (Q8_0, Q4_0, Q4_K, Q6_K) use GGUF's block layouts. */
typedef enum tsr_dtype {
    TSR_DTYPE_F32 = 0,
    TSR_DTYPE_F16 = 1,
    TSR_DTYPE_BF16 = 2,
    TSR_DTYPE_F8_E4M3 = 3,
    TSR_DTYPE_Q8_0 = 4,
    TSR_DTYPE_Q4_0 = 5,
    TSR_DTYPE_Q4_K = 6,
    TSR_DTYPE_Q6_K = 7,
    TSR_DTYPE_I8 = 8,
    TSR_DTYPE_I32 = 9,
    TSR_DTYPE_I64 = 10,
    TSR_DTYPE_COUNT = 11
} tsr_dtype;

/* Capability bits of a descriptor, cross-checked against the manifest. */
#define TSR_CAP_DEVICE_CPU (1u << 0)  /* runs on the CPU            (manifest devices: cpu)  */
#define TSR_CAP_DEVICE_CUDA (1u << 1) /* runs on CUDA devices       (manifest devices: cuda) */
#define TSR_CAP_EXACT (1u << 2)       /* output identical to the reference (exactness: exact) */

/* Typed parameter values, resolved by the host from the assembly and the
 * manifest's defaults before init. Strings are owned by the host. */
typedef enum tsr_param_type {
    TSR_PARAM_INT = 0,
    TSR_PARAM_FLOAT = 1,
    TSR_PARAM_BOOL = 2,
    TSR_PARAM_STRING = 3
} tsr_param_type;

typedef struct tsr_param {
    const char *name;
    tsr_param_type type;
    union {
        int64_t i;
        double f;
        int b;
        const char *s;
    } v;
} tsr_param;

/* What a plugin needs to know of the model to size itself. */
typedef struct tsr_model_desc {
    const char *arch;      /* "llama", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe" */
    int n_layers;
    int hidden;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int ffn;               /* dense FFN width (0 if every layer is MoE) */
    int vocab;
    int max_ctx;           /* the context the engine was sized for */
    int n_experts;         /* 0 for dense models */
    int n_experts_used;    /* experts per token */
    int expert_ffn;
    uint32_t weight_dtype; /* tsr_dtype of the projection weights as stored */
} tsr_model_desc;

/* The values of one forward pass that change from step to step, as the
 * device sees them (ABI 1.1; see tsr_exec.step). */
typedef struct tsr_step {
    int32_t pos0;        /* position of the pass's first row */
    int32_t rows;        /* rows of the pass (fixed for a captured graph) */
    int32_t reserved[2];
} tsr_step;

/* Most rows of a pass the host captures into a CUDA graph (decode and the
 * verification of drafts); plugins that provide cuda_graph size their
 * step-independent scratch for it at init. */
#define TSR_GRAPH_MAX_ROWS 32

/* Where and how a call executes. */
typedef struct tsr_exec {
    int device;     /* tsr_device_kind */
    int device_id;  /* CUDA ordinal; 0 on the CPU */
    void *stream;   /* cudaStream_t on CUDA; NULL on the CPU */
    int n_threads;  /* threads the host's parallel_for uses */
    /* ABI 1.1. NULL, except while the host captures a forward pass into a
     * CUDA graph that it replays for later steps of the same sequence with
     * the same row count; then it points to the pass's tsr_step in device
     * memory, and it is only ever set for plugins whose manifest provides
     * cuda_graph: true. Such a plugin, seeing step != NULL, must:
     * - read the position (and so the KV length) from *step in its kernels,
     *   never from the host arguments pos0 / view->n_tokens, which hold the
     *   capture step's values;
     * - launch the same kernels with the same shapes and pointers whatever
     *   the position (e.g. a fixed number of key splits);
     * - make no synchronising CUDA call and allocate nothing (size scratch
     *   for TSR_GRAPH_MAX_ROWS rows and the model's max_ctx at init);
     * - keep nothing on the host that later steps need, except a kv_cache
     *   plugin's lengths, which replayed() brings up to date. */
    const tsr_step *step;
    /* ABI 1.2. Nonzero when the assembly sets runtime.pdl (CUDA): the host
     * launches its kernels as programmatic dependents of the kernel before
     * them, and a plugin may do so too (kernels/cuda/pdl.cuh: each such
     * kernel waits, griddepcontrol.wait, before it touches memory an earlier
     * kernel wrote or reads, and reads what an earlier kernel wrote with
     * ordinary loads, never __ldg / ld.global.nc, which may be issued ahead
     * of the wait). A plugin that ignores it stays correct. */
    int pdl;
} tsr_exec;

struct tsr_plugin_ctx;
/* A model the host runs on behalf of a plugin, and one sequence of it
 * (tsr_host_api version 2). Opaque. */
typedef struct tsr_aux_model tsr_aux_model;
typedef struct tsr_aux_seq tsr_aux_seq;

/* Log levels for tsr_host_api.log. */
enum { TSR_LOG_ERROR = 0, TSR_LOG_WARN = 1, TSR_LOG_INFO = 2, TSR_LOG_DEBUG = 3 };

/* Work function for parallel_for: process items [i0, i1) as worker tid. */
typedef void (*tsr_work_fn)(void *arg, int64_t i0, int64_t i1, int tid);

/* Services the host gives every plugin. All members are required (the host
 * always fills them); device members answer TSR_ERR_UNSUPPORTED on a host
 * built without CUDA. */
typedef struct tsr_host_api {
    uint32_t struct_size;
    uint32_t version; /* 4: every member below is present, and tsr_weight
                       * carries its version-3 member scale (tsr_gemv.h);
                       * 5: and its member role */
    /* Log a line under the plugin's name. */
    void (*log)(const struct tsr_plugin_ctx *ctx, int level, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
    /* Describe why the call now failing fails; the host shows it with the
     * plugin's name next to the returned status. */
    void (*set_error)(const struct tsr_plugin_ctx *ctx, const char *fmt, ...)
        __attribute__((format(printf, 2, 3)));
    /* Host memory, zeroed, aligned to align (a power of two, >= 16),
     * accounted to the plugin; NULL on failure. free(NULL) does nothing. */
    void *(*alloc)(const struct tsr_plugin_ctx *ctx, size_t size, size_t align);
    void (*free)(const struct tsr_plugin_ctx *ctx, void *p);
    /* Device memory on ctx's device, accounted to the plugin. */
    int (*dev_alloc)(const struct tsr_plugin_ctx *ctx, size_t size, void **out);
    void (*dev_free)(const struct tsr_plugin_ctx *ctx, void *p);
    /* Split [0, n) into chunks over the host's thread pool and wait. Nested
     * calls run inline. Each chunk runs once, with its worker's tid (< the
     * exec's n_threads): no two chunks of one call with the same tid run at
     * once, but a chunk may run on another thread than its worker's (the
     * caller runs those its workers have not started). Returns TSR_OK. */
    int (*parallel_for)(const struct tsr_plugin_ctx *ctx, int64_t n, tsr_work_fn fn, void *arg);
    /* Resolved value of a parameter the manifest declares, NULL otherwise. */
    const tsr_param *(*param)(const struct tsr_plugin_ctx *ctx, const char *name);

    /* --- version 2: models the host runs for a plugin (model-based drafters).
     * Call them from slot members, never from init: the engine's own model
     * is prepared after every plugin is initialised. Each answers
     * TSR_ERR_UNSUPPORTED (after set_error) where the host lends no models. */
    /* Open a model: the checkpoint at path, assembled from assembly (NULL:
     * the reference assembly of the engine's device); or, with path NULL,
     * the engine's own model cut to its first n_layers layers followed by
     * its final norm and output head (self-speculation; n_layers 0: all).
     * Sharing the engine's weights, such a view costs only its scratch. */
    int (*model_open)(const struct tsr_plugin_ctx *ctx, const char *path, const char *assembly,
                      int n_layers, tsr_aux_model **out);
    void (*model_close)(const struct tsr_plugin_ctx *ctx, tsr_aux_model *m);
    /* Vocabulary size and context length of m. */
    int (*model_dims)(const struct tsr_plugin_ctx *ctx, const tsr_aux_model *m, int *vocab,
                      int *max_ctx);
    /* A sequence of up to max_tokens tokens (its own KV). */
    int (*seq_open)(const struct tsr_plugin_ctx *ctx, tsr_aux_model *m, int max_tokens,
                    tsr_aux_seq **out);
    void (*seq_close)(const struct tsr_plugin_ctx *ctx, tsr_aux_seq *s);
    /* Run n tokens after those in s; logits [vocab] of the last one, or NULL. */
    int (*seq_forward)(const struct tsr_plugin_ctx *ctx, tsr_aux_seq *s, const int32_t *tokens,
                       int n, float *logits);
    /* Keep the first n_tokens tokens of s. */
    int (*seq_truncate)(const struct tsr_plugin_ctx *ctx, tsr_aux_seq *s, int n_tokens);

    /* --- version 3: memory. */
    /* The plugin will not read [data, data + nbytes) again: bytes of a weight
     * it was handed (tsr_weight.data, all of it or a part) that it has made
     * its own copy of (quantised, converted, uploaded). Where the range lies
     * in the model file's read-only mapping, the host gives the whole pages
     * inside it back to the system: resident memory shrinks, and whoever
     * reads those bytes later (the host's embedding lookup when the table is
     * tied to the output head, a re-prepare) gets the same bytes back from
     * the file. Anywhere else nothing happens. Returns the bytes given back
     * (0 when none were). Callable from prepare() and from any thread. */
    uint64_t (*weight_done)(const struct tsr_plugin_ctx *ctx, const void *data, uint64_t nbytes);
} tsr_host_api;

/* The context a plugin instance lives in. The host keeps it alive and
 * unchanged for the instance's whole life, so plugins may keep the pointer. */
typedef struct tsr_plugin_ctx {
    const tsr_host_api *host;
    void *host_data;              /* opaque to plugins */
    const char *name;             /* plugin name, for messages */
    int device;                   /* tsr_device_kind the engine runs on */
    int device_id;
    const tsr_model_desc *model;  /* the model the engine serves */
    const tsr_param *params;      /* every declared param, defaults applied */
    int n_params;
} tsr_plugin_ctx;

/* The descriptor a plugin's entry symbol returns. Static, const, and built
 * without running plugin code (no constructors). */
typedef struct tsr_plugin_desc {
    uint32_t abi_major;    /* TSR_ABI_MAJOR at build time */
    uint32_t abi_minor;    /* TSR_ABI_MINOR at build time */
    const char *name;      /* equals the manifest's name */
    uint32_t slot;         /* tsr_slot; equals the manifest's slot */
    const char *version;   /* "MAJOR.MINOR.PATCH"; equals the manifest's */
    size_t instance_size;  /* bytes the host allocates, zeroed, for init */
    uint32_t caps;         /* TSR_CAP_* bits; must agree with the manifest */
    /* required: set up the zeroed instance. On failure, return a negative
     * tsr_status after host->set_error; the host then calls fini (if set),
     * which must cope with a partly initialised instance. */
    int (*init)(void *inst, const tsr_plugin_ctx *ctx);
    /* optional (default: nothing to release): release what init acquired. */
    void (*fini)(void *inst);
    /* required: the slot's interface table (tsr_gemv_i, tsr_attention_i, ...). */
    const void *iface;
} tsr_plugin_desc;

typedef const tsr_plugin_desc *(*tsr_plugin_entry_fn)(void);

/* Each plugin defines exactly this function. */
#define TSR_PLUGIN_ENTRY tsr_plugin_entry

#ifdef __cplusplus
}
#endif
#endif /* TSR_PLUGIN_H */
