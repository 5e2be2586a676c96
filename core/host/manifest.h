/*
 * manifest.h - a plugin's manifest: what the checker knows of a plugin
 * before any of its code runs. docs/MANIFESTS.md is the schema reference.
 *
 * Reading validates the whole schema and reports every problem with the
 * manifest's file:line:col: unknown keys, wrong types, bad names and
 * versions, unsupported FFI types, params whose default breaks their own
 * range, "$NAME" references to undeclared params, quality given for an
 * exact plugin or missing for a lossy one.
 */
#ifndef TSR_MANIFEST_H
#define TSR_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "../../slots/tsr_plugin.h"
#include "diag.h"
#include "ffi.h"
#include "ydoc.h"

#define TSR_DEVMASK_CPU (1u << TSR_DEVICE_CPU)
#define TSR_DEVMASK_CUDA (1u << TSR_DEVICE_CUDA)

/* A capability (provides) or a constraint (requires): a key and the set of
 * values, each normalised to text ("true", "42", "f16"). A provides value
 * "$NAME" stands for the resolved value of param NAME. */
typedef struct tsr_mcap {
    char *key;
    char **values;
    int n_values;
    int line, col;
} tsr_mcap;

typedef struct tsr_mparam {
    char *name;
    tsr_param_type type;
    tsr_param def;            /* def.name == name; def.v.s owned */
    int has_min, has_max;
    double min, max;          /* int params: whole numbers */
    char **values;            /* string params: the accepted values, or none */
    int n_values;
    char *description;
    int line, col;
} tsr_mparam;

typedef struct tsr_mexport {
    char *name;
    char *signature;          /* as written */
    tsr_ffi_sig sig;
    int line, col;
} tsr_mexport;

typedef struct tsr_manifest {
    char *path;               /* the manifest file */
    char *name;
    tsr_slot slot;
    char *version;
    int abi_major, abi_minor;
    char *library;            /* as written */
    char *library_path;       /* resolved against the manifest's folder */
    char sha256[65];          /* lowercase hex */
    unsigned devices;         /* TSR_DEVMASK_* */
    int exact;
    int has_quality;
    double max_mean_kl, max_ppl_ratio;
    unsigned baseline;        /* TSR_DEVMASK_* */
    int test;
    char *description;
    tsr_mcap *provides;
    int n_provides;
    tsr_mcap *requires;
    int n_requires;
    tsr_mparam *params;
    int n_params;
    tsr_mexport *exports;
    int n_exports;
    tsr_ynode *doc;           /* the parsed document, for positions */
} tsr_manifest;

/* Read and validate a manifest. On failure returns the first error's code,
 * adds every problem to d and sets *out to NULL. */
int tsr_manifest_load(const char *path, tsr_manifest **out, tsr_diag *d);
/* The same from memory (fuzzing, tests); path names it and anchors library. */
int tsr_manifest_parse(const char *buf, size_t len, const char *path, tsr_manifest **out, tsr_diag *d);
void tsr_manifest_free(tsr_manifest *m);

/* Line:col of a top-level key (0:0 if absent). */
void tsr_manifest_pos(const tsr_manifest *m, const char *key, int *line, int *col);

const tsr_mparam *tsr_manifest_param(const tsr_manifest *m, const char *name);
const tsr_mcap *tsr_manifest_provides(const tsr_manifest *m, const char *key);
const tsr_mexport *tsr_manifest_export(const tsr_manifest *m, const char *name);

/* Check value node v against param p; on success fill *out (strings point
 * into v). On failure writes a reason to msg and returns TSR_ERR_INVALID. */
int tsr_mparam_check(const tsr_mparam *p, const tsr_ynode *v, tsr_param *out, char *msg, size_t size);

/* Names: "attention", ... and back (-1 if unknown); "cpu"/"cuda". */
const char *tsr_slot_name(tsr_slot s);
int tsr_slot_from_name(const char *s);
const char *tsr_device_name(int dev);
int tsr_device_from_name(const char *s);
/* "a, b" for a device mask. */
void tsr_devmask_format(unsigned mask, char *buf, size_t size);
/* Text of a param value as the checker compares it ("42", "0.5", "true"). */
void tsr_param_format(const tsr_param *p, char *buf, size_t size);

#endif /* TSR_MANIFEST_H */
