/*
 * checker.h - everything checked before the first dlopen.
 *
 * Given a catalog and an assembly, resolve one plugin per slot (a slot left
 * out takes the catalog's single baseline for the device; never a test
 * plugin unless allowed) and check: the plugin exists and fills that slot;
 * it runs on the assembly's device; it is not a test plugin (unless the
 * caller allows them); the assembly's params (unknown name, wrong type, out
 * of range, not in values); each plugin's requires against the others'
 * provides (after $param substitution), the device and the model (when one
 * is given; otherwise noted as "not checked: no model"); the library's
 * sha256 and that neither the library nor its folder is writable by group or
 * others. Every problem is collected. No fallbacks: an incompatible assembly
 * is refused, never changed.
 */
#ifndef TSR_CHECKER_H
#define TSR_CHECKER_H

#include "../format/model_config.h"
#include "assembly.h"
#include "catalog.h"
#include "diag.h"

typedef struct tsr_plan_slot {
    const tsr_manifest *m;     /* NULL if unresolved (then the check failed) */
    int given;                 /* named in the assembly (else its baseline) */
    tsr_param *params;         /* every declared param, defaults applied; strings borrowed
                                * from the manifest or the assembly */
    int n_params;
} tsr_plan_slot;

typedef struct tsr_plan {
    const tsr_catalog *catalog;
    const tsr_assembly *assembly;
    int device;
    tsr_plan_slot slots[TSR_SLOT_COUNT];
} tsr_plan;

typedef struct tsr_check_opts {
    const tsr_model_config *model; /* NULL: model requirements are only noted */
    int allow_test;                /* test plugins may be chosen */
    int skip_files;                /* do not look at library files (fuzzing) */
} tsr_check_opts;

/* Check; on success *out is the plan (it borrows catalog and assembly). On
 * failure every problem is in d, *out is NULL and the first error's code is
 * returned. Notes (things not checked) go to d either way. */
int tsr_check(const tsr_catalog *cat, const tsr_assembly *a, const tsr_check_opts *opts,
              tsr_plan **out, tsr_diag *d);
void tsr_plan_free(tsr_plan *p);

/* The library file of m: present, a regular file, sha256 as declared, and
 * neither it nor its folder writable by group or others. Adds problems to d
 * and returns how many. */
int tsr_check_library(const tsr_manifest *m, tsr_diag *d);

/* Value j of capability cap provided by plan slot s, "$NAME" resolved. */
void tsr_plan_provided(const tsr_plan_slot *s, const tsr_mcap *cap, int j, char *buf, size_t size);

/* Value of model field (as a manifest's requires names it) for cfg, as text;
 * 0 if the field is unknown. */
int tsr_model_field(const tsr_model_config *cfg, const char *field, char *buf, size_t size);
/* "f32", "f16", "bf16", "q8_0", ... */
const char *tsr_dtype_short_name(uint32_t dtype);

#endif /* TSR_CHECKER_H */
