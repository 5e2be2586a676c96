#include "ffi.h"

#include <ctype.h>
#include <errno.h>
#include <ffi.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static const char *const type_names[TSR_FFI_TYPE_COUNT] = {
    "void", "bool", "int32", "int64", "uint32", "uint64", "float", "double", "string"};

const char *tsr_ffi_type_name(tsr_ffi_type t) {
    return (unsigned)t < TSR_FFI_TYPE_COUNT ? type_names[t] : "?";
}

static int type_lookup(const char *s, size_t n) {
    for (int t = 0; t < TSR_FFI_TYPE_COUNT; t++)
        if (strlen(type_names[t]) == n && !strncmp(type_names[t], s, n)) return t;
    return -1;
}

static const char *skip_ws(const char *p) {
    while (*p == ' ' || *p == '\t') p++;
    return p;
}

static int sig_fail(tsr_error *err, int *col_off, const char *sig, const char *at, const char *fmt,
                    const char *word, size_t wlen) {
    if (col_off) *col_off = (int)(at - sig);
    char w[64];
    snprintf(w, sizeof w, "%.*s", (int)(wlen > 60 ? 60 : wlen), word ? word : "");
    return tsr_error_set(err, TSR_ERR_FORMAT, fmt, w);
}

int tsr_ffi_sig_parse(const char *sig, tsr_ffi_sig *out, int *col_off, tsr_error *err) {
    memset(out, 0, sizeof *out);
    if (col_off) *col_off = 0;
    const char *p = skip_ws(sig);
    const char *w = p;
    while (isalnum((unsigned char)*p) || *p == '_') p++;
    if (p == w)
        return sig_fail(err, col_off, sig, w,
                        "signature must be \"RET (ARG, ...)\": missing return type%s", "", 0);
    int t = type_lookup(w, (size_t)(p - w));
    if (t < 0)
        return sig_fail(err, col_off, sig, w,
                        "unsupported return type '%s' (use void, bool, int32, int64, uint32, "
                        "uint64, float, double or string)",
                        w, (size_t)(p - w));
    out->ret = (tsr_ffi_type)t;
    p = skip_ws(p);
    if (*p != '(')
        return sig_fail(err, col_off, sig, p, "expected '(' after the return type%s", "", 0);
    p = skip_ws(p + 1);
    if (*p == ')') {
        p = skip_ws(p + 1);
        if (*p) return sig_fail(err, col_off, sig, p, "unexpected text after ')': '%s'", p, strlen(p));
        return TSR_OK;
    }
    for (;;) {
        p = skip_ws(p);
        w = p;
        while (isalnum((unsigned char)*p) || *p == '_') p++;
        if (p == w) return sig_fail(err, col_off, sig, w, "expected an argument type%s", "", 0);
        t = type_lookup(w, (size_t)(p - w));
        if (t < 0 || t == TSR_FFI_VOID)
            return sig_fail(err, col_off, sig, w,
                            "unsupported argument type '%s' (use bool, int32, int64, uint32, "
                            "uint64, float, double or string)",
                            w, (size_t)(p - w));
        if (out->n_args >= TSR_FFI_MAX_ARGS)
            return sig_fail(err, col_off, sig, w, "more than 16 arguments%s", "", 0);
        out->args[out->n_args++] = (tsr_ffi_type)t;
        p = skip_ws(p);
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p == ')') break;
        return sig_fail(err, col_off, sig, p, "expected ',' or ')' in the argument list%s", "", 0);
    }
    p = skip_ws(p + 1);
    if (*p) return sig_fail(err, col_off, sig, p, "unexpected text after ')': '%s'", p, strlen(p));
    return TSR_OK;
}

void tsr_ffi_sig_format(const tsr_ffi_sig *s, char *buf, size_t size) {
    size_t o = (size_t)snprintf(buf, size, "%s (", tsr_ffi_type_name(s->ret));
    for (int i = 0; i < s->n_args && o < size; i++)
        o += (size_t)snprintf(buf + o, size - o, "%s%s", i ? ", " : "", tsr_ffi_type_name(s->args[i]));
    if (o < size) snprintf(buf + o, size - o, ")");
}

int tsr_ffi_value_parse(tsr_ffi_type t, const char *text, tsr_ffi_value *out, tsr_error *err) {
    memset(out, 0, sizeof *out);
    out->type = t;
    char *end = NULL;
    errno = 0;
    switch (t) {
    case TSR_FFI_BOOL:
        if (!strcmp(text, "true") || !strcmp(text, "1")) out->v.b = 1;
        else if (!strcmp(text, "false") || !strcmp(text, "0")) out->v.b = 0;
        else return tsr_error_set(err, TSR_ERR_INVALID, "'%s' is not a bool (true or false)", text);
        return TSR_OK;
    case TSR_FFI_INT32:
    case TSR_FFI_INT64: {
        long long v = strtoll(text, &end, 0);
        if (!text[0] || *end || errno == ERANGE ||
            (t == TSR_FFI_INT32 && (v < INT32_MIN || v > INT32_MAX)))
            return tsr_error_set(err, TSR_ERR_INVALID, "'%s' is not an %s", text, tsr_ffi_type_name(t));
        out->v.i = v;
        return TSR_OK;
    }
    case TSR_FFI_UINT32:
    case TSR_FFI_UINT64: {
        if (text[0] == '-')
            return tsr_error_set(err, TSR_ERR_INVALID, "'%s' is not a %s", text, tsr_ffi_type_name(t));
        unsigned long long v = strtoull(text, &end, 0);
        if (!text[0] || *end || errno == ERANGE || (t == TSR_FFI_UINT32 && v > UINT32_MAX))
            return tsr_error_set(err, TSR_ERR_INVALID, "'%s' is not a %s", text, tsr_ffi_type_name(t));
        out->v.u = v;
        return TSR_OK;
    }
    case TSR_FFI_FLOAT:
    case TSR_FFI_DOUBLE: {
        double v = strtod(text, &end);
        if (!text[0] || *end || !isfinite(v))
            return tsr_error_set(err, TSR_ERR_INVALID, "'%s' is not a finite number", text);
        out->v.f = v;
        return TSR_OK;
    }
    case TSR_FFI_STRING: out->v.s = text; return TSR_OK;
    default: return tsr_error_set(err, TSR_ERR_INVALID, "no value of type %s", tsr_ffi_type_name(t));
    }
}

void tsr_ffi_value_format(const tsr_ffi_value *v, char *buf, size_t size) {
    switch (v->type) {
    case TSR_FFI_VOID: snprintf(buf, size, "(void)"); break;
    case TSR_FFI_BOOL: snprintf(buf, size, "%s", v->v.b ? "true" : "false"); break;
    case TSR_FFI_INT32:
    case TSR_FFI_INT64: snprintf(buf, size, "%" PRId64, v->v.i); break;
    case TSR_FFI_UINT32:
    case TSR_FFI_UINT64: snprintf(buf, size, "%" PRIu64, v->v.u); break;
    case TSR_FFI_FLOAT: snprintf(buf, size, "%.9g", v->v.f); break;
    case TSR_FFI_DOUBLE: snprintf(buf, size, "%.17g", v->v.f); break;
    case TSR_FFI_STRING: snprintf(buf, size, "%s", v->v.s ? v->v.s : "(null)"); break;
    default: snprintf(buf, size, "?"); break;
    }
}

static ffi_type *ffi_of(tsr_ffi_type t) {
    switch (t) {
    case TSR_FFI_VOID: return &ffi_type_void;
    case TSR_FFI_BOOL: return &ffi_type_uint8; /* C bool is one byte on every ABI we target */
    case TSR_FFI_INT32: return &ffi_type_sint32;
    case TSR_FFI_INT64: return &ffi_type_sint64;
    case TSR_FFI_UINT32: return &ffi_type_uint32;
    case TSR_FFI_UINT64: return &ffi_type_uint64;
    case TSR_FFI_FLOAT: return &ffi_type_float;
    case TSR_FFI_DOUBLE: return &ffi_type_double;
    case TSR_FFI_STRING: return &ffi_type_pointer;
    default: return NULL;
    }
}

typedef union ffi_slot {
    uint8_t b;
    int32_t i32;
    int64_t i64;
    uint32_t u32;
    uint64_t u64;
    float f;
    double d;
    const char *s;
    ffi_arg widened; /* small integer returns come back widened to ffi_arg */
} ffi_slot;

/* Convert v into the argument slot of declared type t. */
static int arg_convert(tsr_ffi_type t, const tsr_ffi_value *v, ffi_slot *out, int idx, tsr_error *err) {
    int v_int = v->type == TSR_FFI_INT32 || v->type == TSR_FFI_INT64;
    int v_uint = v->type == TSR_FFI_UINT32 || v->type == TSR_FFI_UINT64;
    int v_flt = v->type == TSR_FFI_FLOAT || v->type == TSR_FFI_DOUBLE;
    switch (t) {
    case TSR_FFI_BOOL:
        if (v->type != TSR_FFI_BOOL) break;
        out->b = v->v.b ? 1 : 0;
        return 0;
    case TSR_FFI_INT32:
    case TSR_FFI_INT64:
    case TSR_FFI_UINT32:
    case TSR_FFI_UINT64: {
        int64_t lo = t == TSR_FFI_INT32 ? INT32_MIN : t == TSR_FFI_INT64 ? INT64_MIN : 0;
        uint64_t hi = t == TSR_FFI_INT32 ? INT32_MAX : t == TSR_FFI_INT64 ? INT64_MAX
                      : t == TSR_FFI_UINT32 ? UINT32_MAX : UINT64_MAX;
        if (v_int) {
            if (v->v.i < lo || (v->v.i > 0 && (uint64_t)v->v.i > hi)) goto range;
            if (t == TSR_FFI_INT32) out->i32 = (int32_t)v->v.i;
            else if (t == TSR_FFI_INT64) out->i64 = v->v.i;
            else if (t == TSR_FFI_UINT32) out->u32 = (uint32_t)v->v.i;
            else out->u64 = (uint64_t)v->v.i;
            return 0;
        }
        if (v_uint) {
            if (v->v.u > hi) goto range;
            if (t == TSR_FFI_INT32) out->i32 = (int32_t)v->v.u;
            else if (t == TSR_FFI_INT64) out->i64 = (int64_t)v->v.u;
            else if (t == TSR_FFI_UINT32) out->u32 = (uint32_t)v->v.u;
            else out->u64 = v->v.u;
            return 0;
        }
        break;
    range:
        return tsr_error_set(err, TSR_ERR_INVALID, "argument %d out of range for %s", idx + 1,
                             tsr_ffi_type_name(t));
    }
    case TSR_FFI_FLOAT:
    case TSR_FFI_DOUBLE: {
        double x;
        if (v_flt) x = v->v.f;
        else if (v_int) x = (double)v->v.i;
        else if (v_uint) x = (double)v->v.u;
        else break;
        if (t == TSR_FFI_FLOAT) out->f = (float)x;
        else out->d = x;
        return 0;
    }
    case TSR_FFI_STRING:
        if (v->type != TSR_FFI_STRING || !v->v.s) break;
        out->s = v->v.s;
        return 0;
    default: break;
    }
    return tsr_error_set(err, TSR_ERR_INVALID, "argument %d: expected %s, got %s", idx + 1,
                         tsr_ffi_type_name(t), tsr_ffi_type_name(v->type));
}

int tsr_ffi_call(void (*fn)(void), const tsr_ffi_sig *sig, const tsr_ffi_value *args, int n,
                 tsr_ffi_value *ret, tsr_error *err) {
    if (!fn) return tsr_error_set(err, TSR_ERR_INVALID, "no function to call");
    if (n != sig->n_args)
        return tsr_error_set(err, TSR_ERR_INVALID, "expected %d argument%s, got %d", sig->n_args,
                             sig->n_args == 1 ? "" : "s", n);
    ffi_type *types[TSR_FFI_MAX_ARGS];
    ffi_slot slots[TSR_FFI_MAX_ARGS];
    void *values[TSR_FFI_MAX_ARGS];
    memset(slots, 0, sizeof slots);
    for (int i = 0; i < n; i++) {
        int rc = arg_convert(sig->args[i], &args[i], &slots[i], i, err);
        if (rc) return rc;
        types[i] = ffi_of(sig->args[i]);
        values[i] = &slots[i];
    }
    ffi_cif cif;
    if (ffi_prep_cif(&cif, FFI_DEFAULT_ABI, (unsigned)n, ffi_of(sig->ret), types) != FFI_OK)
        return tsr_error_set(err, TSR_ERR_INVALID, "libffi cannot prepare this signature");
    ffi_slot r;
    memset(&r, 0, sizeof r);
    ffi_call(&cif, fn, &r, values);
    memset(ret, 0, sizeof *ret);
    ret->type = sig->ret;
    switch (sig->ret) {
    case TSR_FFI_VOID: break;
    case TSR_FFI_BOOL: ret->v.b = (uint8_t)r.widened != 0; break;
    case TSR_FFI_INT32: ret->v.i = (int32_t)r.widened; break;
    case TSR_FFI_INT64: ret->v.i = r.i64; break;
    case TSR_FFI_UINT32: ret->v.u = (uint32_t)r.widened; break;
    case TSR_FFI_UINT64: ret->v.u = r.u64; break;
    case TSR_FFI_FLOAT: ret->v.f = r.f; break;
    case TSR_FFI_DOUBLE: ret->v.f = r.d; break;
    case TSR_FFI_STRING: ret->v.s = r.s; break;
    default: break;
    }
    return TSR_OK;
}
