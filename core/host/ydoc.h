/*
 * ydoc.h - a YAML document read into a small tree that keeps the line and
 * column of every node, for error messages. Manifests and assemblies are
 * validated on this tree (a Lua assembly's returned table is converted into
 * one too, so both kinds of assembly share one validator).
 *
 * Refused while reading, with the line:column libyaml gives: malformed YAML,
 * more than one document, anchors, aliases, tags, duplicate mapping keys,
 * non-scalar mapping keys, nesting deeper than TSR_YDOC_MAX_DEPTH, and
 * documents larger than TSR_YDOC_MAX_BYTES.
 */
#ifndef TSR_YDOC_H
#define TSR_YDOC_H

#include <stddef.h>
#include <stdint.h>

#include "diag.h"

#define TSR_YDOC_MAX_BYTES (1u << 20)
#define TSR_YDOC_MAX_DEPTH 64

typedef enum tsr_ynode_kind {
    TSR_YNODE_SCALAR = 0,
    TSR_YNODE_MAP = 1, /* items: key0, value0, key1, value1, ... (keys are scalars) */
    TSR_YNODE_SEQ = 2
} tsr_ynode_kind;

typedef struct tsr_ynode {
    tsr_ynode_kind kind;
    int line, col;             /* 1-based; 0 when unknown (converted Lua values) */
    int quoted;                /* scalar written with quotes (or a Lua string): a string */
    char *str;                 /* scalar text, NUL-terminated */
    struct tsr_ynode **items;
    int n;                     /* items (a map holds 2 * pairs) */
    int cap;
} tsr_ynode;

/* Parse buf[0, len) as one YAML document. file names it in errors. On
 * failure every problem found is added to d (reading stops at the first
 * syntax error) and *out is NULL. An empty document gives an empty map. */
int tsr_ydoc_parse(const char *buf, size_t len, const char *file, tsr_ynode **out, tsr_diag *d);
/* Read the file (refusing it above TSR_YDOC_MAX_BYTES) and parse it. */
int tsr_ydoc_load(const char *path, tsr_ynode **out, tsr_diag *d);
void tsr_ynode_free(tsr_ynode *n);

/* Building trees by hand (the Lua converter, tests). NULL on no memory. */
tsr_ynode *tsr_ynode_new(tsr_ynode_kind kind, int line, int col);
tsr_ynode *tsr_ynode_scalar(const char *s, size_t len, int quoted, int line, int col);
int tsr_ynode_push(tsr_ynode *parent, tsr_ynode *child); /* -1 on no memory (child not taken) */

/* Map lookup; NULL if absent or m is not a map. */
const tsr_ynode *tsr_ynode_get(const tsr_ynode *m, const char *key);
static inline int tsr_ynode_pairs(const tsr_ynode *m) { return m->n / 2; }
static inline const tsr_ynode *tsr_ynode_key(const tsr_ynode *m, int i) { return m->items[2 * i]; }
static inline const tsr_ynode *tsr_ynode_val(const tsr_ynode *m, int i) { return m->items[2 * i + 1]; }

/* Typed reading of scalars (YAML 1.2 core schema; quoted scalars are always
 * strings). Each returns 1 when n is a scalar of that type, 0 otherwise. */
int tsr_ynode_is_null(const tsr_ynode *n);
int tsr_ynode_as_bool(const tsr_ynode *n, int *out);
int tsr_ynode_as_int(const tsr_ynode *n, int64_t *out);
int tsr_ynode_as_float(const tsr_ynode *n, double *out); /* ints are floats too */
/* A string: a quoted scalar, or a plain one that is not null, a bool or a number. */
int tsr_ynode_as_str(const tsr_ynode *n, const char **out);
const char *tsr_ynode_kind_name(const tsr_ynode *n); /* "string", "integer", "mapping", ... */

#endif /* TSR_YDOC_H */
