/*
 * conf_host.h - a stand-alone plugin host for tests: the tsr_host_api
 * services (accounted allocation with a fail-at-N hook, the thread pool's
 * parallel_for, params, set_error capture), dlopen of a catalog manifest's
 * library with the descriptor cross-check, and instances built from it.
 *
 * The conformance harness and the plugins' own tests use it to make one
 * instance of one plugin at a time, with params chosen per test case, which
 * an assembled tsr_engine (one plugin per slot) does not offer.
 */
#ifndef TSR_CONF_HOST_H
#define TSR_CONF_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "core/host/catalog.h"
#include "core/host/manifest.h"
#include "core/host/engine.h"
#include "core/util/threadpool.h"

#define CONF_MAX_PARAMS 32

/* One instance of one plugin, reachable as a tsr_slot_ref for the wrappers
 * of core/host/slot_calls.h. */
typedef struct conf_inst {
    tsr_plugin_ctx ctx;
    tsr_host_api api;
    tsr_param params[CONF_MAX_PARAMS];
    char strs[CONF_MAX_PARAMS][128];   /* string param values */
    int n_params;
    const tsr_plugin_desc *desc;
    tsr_slot_ref ref;
    tsr_model_desc model;
    tsr_threadpool *pool;              /* borrowed */
    char err[1024];                    /* last set_error text */
    int64_t live_allocs;
    uint64_t live_bytes;
    uint64_t fail_at;                  /* the fail_at-th alloc from now fails (0: never) */
    int quiet;                         /* drop log lines */
} conf_inst;

/* Member of ci's interface table (type: tsr_gemv_i, ...) if the table the
 * plugin was built with holds it, else NULL (the host's wrappers' rule). */
#define CONF_MEMBER(ci, type, member)                                                       \
    (((const uint32_t *)(ci)->ref.iface)[0] >= offsetof(type, member) + sizeof(void *)       \
         ? ((const type *)(ci)->ref.iface)->member                                          \
         : NULL)
#define CONF_INST(ci) ((ci)->ref.inst)

/* A plugin library, opened once. */
typedef struct conf_lib {
    void *handle;
    const tsr_plugin_desc *desc;
} conf_lib;

/* Open m's library and cross-check its descriptor (ABI, name, slot,
 * version, interface size and required members). 0, or -1 with why. */
int conf_lib_open(const tsr_manifest *m, conf_lib *lib, char *why, size_t size);
/* Open a library by path with no manifest (plugins' own tests). */
int conf_lib_open_path(const char *path, conf_lib *lib, char *why, size_t size);
void conf_lib_close(conf_lib *lib);

/* Make an instance of desc: params are the manifest's defaults (m may be
 * NULL) overridden by "name=value" strings in set (n_set of them; a name
 * the manifest does not declare is an error). Returns init's status, the
 * instance in *out (freed with conf_inst_free, also after a failed init). */
int conf_inst_new(const tsr_plugin_desc *desc, const tsr_manifest *m, const tsr_model_desc *model,
                  const char *const *set, int n_set, tsr_threadpool *pool, conf_inst **out);
void conf_inst_free(conf_inst *ci);

/* The directory of plugins' libraries: $TESSERA_CATALOG (NULL if unset). */
const char *conf_catalog_dir(void);

/* Load plugin name's manifest from the catalog and open its library (a
 * plugin's own tests, as CMocka setup). 0, or -1 with the reason on stderr. */
int conf_catalog_open(const char *name, tsr_manifest **m, conf_lib *lib);

#endif /* TSR_CONF_HOST_H */
