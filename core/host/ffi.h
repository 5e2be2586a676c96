/*
 * ffi.h - extra plugin functions ("exports" in a manifest) called through
 * libffi from their declared C signature.
 *
 * A signature is "RET (ARG, ARG, ...)" with RET and each ARG one of the
 * types below ("int64 (int32, int32)", "void ()", "double (string)").
 * Exported functions are pure functions of their arguments: they are called
 * without a plugin instance, may be called before (or without) init, and
 * must not keep the string pointers they are given.
 */
#ifndef TSR_FFI_H
#define TSR_FFI_H

#include <stdint.h>

#include "../util/error.h"

#define TSR_FFI_MAX_ARGS 16

typedef enum tsr_ffi_type {
    TSR_FFI_VOID = 0, /* return only */
    TSR_FFI_BOOL,     /* C bool */
    TSR_FFI_INT32,
    TSR_FFI_INT64,
    TSR_FFI_UINT32,
    TSR_FFI_UINT64,
    TSR_FFI_FLOAT,
    TSR_FFI_DOUBLE,
    TSR_FFI_STRING,   /* const char *, NUL-terminated */
    TSR_FFI_TYPE_COUNT
} tsr_ffi_type;

typedef struct tsr_ffi_sig {
    tsr_ffi_type ret;
    int n_args;
    tsr_ffi_type args[TSR_FFI_MAX_ARGS];
} tsr_ffi_sig;

/* A value crossing the call, tagged with its type. Strings are borrowed. */
typedef struct tsr_ffi_value {
    tsr_ffi_type type;
    union {
        int b;
        int64_t i;  /* int32 / int64 */
        uint64_t u; /* uint32 / uint64 */
        double f;   /* float / double */
        const char *s;
    } v;
} tsr_ffi_value;

const char *tsr_ffi_type_name(tsr_ffi_type t);

/* Parse a signature. On failure returns TSR_ERR_FORMAT with a message naming
 * the offending type; *col_off receives the 0-based offset in sig of the
 * problem (for a file:line:col). */
int tsr_ffi_sig_parse(const char *sig, tsr_ffi_sig *out, int *col_off, tsr_error *err);
/* Write the signature back in its canonical spelling. */
void tsr_ffi_sig_format(const tsr_ffi_sig *s, char *buf, size_t size);

/* Convert text (a CLI argument) to a value of type t: integers in range,
 * finite floats, bools as true/false/1/0. */
int tsr_ffi_value_parse(tsr_ffi_type t, const char *text, tsr_ffi_value *out, tsr_error *err);
/* Print a value ("42", "0.5", "true", the string). */
void tsr_ffi_value_format(const tsr_ffi_value *v, char *buf, size_t size);

/* Call fn with args (n must equal the signature's count, and each arg's type
 * must convert: integer types are range-checked into the declared type). */
int tsr_ffi_call(void (*fn)(void), const tsr_ffi_sig *sig, const tsr_ffi_value *args, int n,
                 tsr_ffi_value *ret, tsr_error *err);

#endif /* TSR_FFI_H */
