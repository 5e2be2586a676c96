/*
 * assembly.h - an assembly: a device and one plugin per slot, with params.
 *
 * Written as YAML (.yaml/.yml) or as a Lua 5.4 script (.lua, see
 * lua_assembly.h) that returns the same table; both end as a tsr_ynode tree
 * validated here by one validator. Unknown keys and wrong types are errors
 * with the document's line:col (Lua values have no column: file only).
 *
 *   name: cpu-reference
 *   description: "..."        # optional
 *   device: cpu                # cpu | cuda
 *   slots:                     # a slot left out takes its baseline plugin
 *     gemv: ref_gemv
 *     attention: {plugin: ref_attention, params: {threads: 2}}
 */
#ifndef TSR_ASSEMBLY_H
#define TSR_ASSEMBLY_H

#include <stddef.h>

#include "../format/model_config.h"
#include "catalog.h"
#include "diag.h"
#include "ydoc.h"

typedef struct tsr_aslot {
    int given;                 /* named in the assembly */
    char *plugin;
    const tsr_ynode *params;   /* a mapping (into the assembly's doc) or NULL */
    int line, col;             /* where the slot is named */
} tsr_aslot;

/* The model runtime's own switches (an assembly's `runtime:` mapping, not
 * plugins), each off unless set true. One entry here, its key in
 * assembly.c's table and its check in checker.c's make a new one: the
 * engine describes it, `tessera ablate` measures it as an exact factor. */
typedef enum tsr_rt_switch {
    TSR_RT_CUDA_GRAPHS, /* cuda_graphs: replay decode passes as CUDA graphs (graph.c) */
    TSR_RT_PDL,         /* pdl: kernels launched as programmatic dependents (CUDA) */
    TSR_RT_PIPELINE,    /* pipeline: decode (greedy or drawn on the device) queues the next pass before
                         * reading the token it follows (generate.c, pipe.c) */
    TSR_RT_COUNT
} tsr_rt_switch;

/* A switch as the assembly sets it. */
typedef struct tsr_rt_value {
    int on;
    int line, col; /* of its value (0: not set) */
} tsr_rt_value;

/* The switch's key under runtime: ("cuda_graphs"); NULL out of range. */
const char *tsr_rt_switch_name(tsr_rt_switch s);

typedef struct tsr_assembly {
    char *path;
    char *name;
    char *description;
    int device;                /* tsr_device_kind */
    int line, col;             /* of the document (for slots left out) */
    tsr_aslot slots[TSR_SLOT_COUNT];
    tsr_rt_value runtime[TSR_RT_COUNT]; /* runtime: the model runtime's switches */
    tsr_ynode *doc;
} tsr_assembly;

/* What a Lua assembly may see. */
typedef struct tsr_assembly_env {
    const tsr_catalog *catalog;        /* tessera.catalog(), tessera.call() */
    const tsr_model_config *model;     /* tessera.model; NULL: nil */
    int device;                        /* tessera.device() */
    int allow_test;                    /* test plugins may be called */
    uint64_t lua_instructions;         /* 0: TSR_LUA_DEFAULT_INSTRUCTIONS */
    size_t lua_memory;                 /* 0: TSR_LUA_DEFAULT_MEMORY */
} tsr_assembly_env;

/* Validate a tree (takes ownership of root, also on failure). */
int tsr_assembly_from_tree(tsr_ynode *root, const char *path, tsr_assembly **out, tsr_diag *d);
/* YAML from memory. */
int tsr_assembly_parse(const char *buf, size_t len, const char *path, tsr_assembly **out, tsr_diag *d);
/* A file: .lua runs the script with env (which may be NULL for YAML), any
 * other extension is read as YAML. */
int tsr_assembly_load(const char *path, const tsr_assembly_env *env, tsr_assembly **out, tsr_diag *d);
void tsr_assembly_free(tsr_assembly *a);

#endif /* TSR_ASSEMBLY_H */
