/*
 * diag.h - a list of every problem found, not just the first: the checker
 * collects all of them so `tessera check` can print them together. Notes
 * are things deliberately not checked (e.g. model requirements with no
 * model given); they are not errors.
 */
#ifndef TSR_DIAG_H
#define TSR_DIAG_H

#include "../util/error.h"

#define TSR_DIAG_MAX 256 /* further errors are counted, not kept */

typedef struct tsr_diag {
    tsr_error *errors;
    int n_errors, cap_errors;
    int n_dropped;       /* errors not kept (over TSR_DIAG_MAX or no memory) */
    char **notes;
    int n_notes, cap_notes;
} tsr_diag;

void tsr_diag_init(tsr_diag *d);
void tsr_diag_free(tsr_diag *d);   /* frees the contents; d itself is the caller's */

/* Record an error (file may be NULL or "", line/col 0 = unknown). Returns code. */
int tsr_diag_add(tsr_diag *d, int code, const char *file, int line, int col, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* Record a copy of an existing error. */
void tsr_diag_add_error(tsr_diag *d, const tsr_error *e);
void tsr_diag_note(tsr_diag *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

int tsr_diag_count(const tsr_diag *d); /* errors, dropped ones included */

/* err = the first error, its message suffixed with "(and N more errors)". */
int tsr_diag_to_error(const tsr_diag *d, tsr_error *err);
/* Print every error as "file:line:col: error: msg", then the notes. */
void tsr_diag_print(const tsr_diag *d, FILE *f);

#endif /* TSR_DIAG_H */
