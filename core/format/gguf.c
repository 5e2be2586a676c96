#include "gguf.h"

#include <stdlib.h>
#include <string.h>

#include "../../kernels/dtype.h"
#include "../util/checked.h"
#include "format_internal.h"

#define GGUF_MAX_NAME 256

/* GGML tensor types whose block sizes we know; dtype is TSR_DTYPE_COUNT for
 * those we can size but not compute with (a model using them is refused when
 * opened, naming the tensor; the metadata stays readable). */
static const struct {
    uint32_t id;
    const char *name;
    uint32_t block;
    uint32_t bytes;
    uint32_t dtype;
} ggml_types[] = {
    {0, "F32", 1, 4, TSR_DTYPE_F32},          {1, "F16", 1, 2, TSR_DTYPE_F16},
    {2, "Q4_0", 32, 18, TSR_DTYPE_Q4_0},      {3, "Q4_1", 32, 20, TSR_DTYPE_COUNT},
    {6, "Q5_0", 32, 22, TSR_DTYPE_COUNT},     {7, "Q5_1", 32, 24, TSR_DTYPE_COUNT},
    {8, "Q8_0", 32, 34, TSR_DTYPE_Q8_0},      {9, "Q8_1", 32, 36, TSR_DTYPE_COUNT},
    {10, "Q2_K", 256, 84, TSR_DTYPE_COUNT},   {11, "Q3_K", 256, 110, TSR_DTYPE_COUNT},
    {12, "Q4_K", 256, 144, TSR_DTYPE_Q4_K},   {13, "Q5_K", 256, 176, TSR_DTYPE_COUNT},
    {14, "Q6_K", 256, 210, TSR_DTYPE_Q6_K},   {15, "Q8_K", 256, 292, TSR_DTYPE_COUNT},
    {24, "I8", 1, 1, TSR_DTYPE_I8},           {25, "I16", 1, 2, TSR_DTYPE_COUNT},
    {26, "I32", 1, 4, TSR_DTYPE_I32},         {27, "I64", 1, 8, TSR_DTYPE_I64},
    {28, "F64", 1, 8, TSR_DTYPE_COUNT},       {30, "BF16", 1, 2, TSR_DTYPE_BF16},
};

static int ggml_type_find(uint32_t id) {
    for (size_t i = 0; i < sizeof ggml_types / sizeof ggml_types[0]; i++)
        if (ggml_types[i].id == id) return (int)i;
    return -1;
}

typedef struct gguf_kv {
    char *key;
    tsr_gguf_type type;
    uint64_t val;        /* offset of the value in buf (after the type) */
    tsr_gguf_type elem;  /* arrays: element type */
    uint64_t n;          /* arrays: element count */
    uint64_t data;       /* arrays: offset of the first element */
    uint64_t *str_offs;  /* string arrays: offset of each element's length */
} gguf_kv;

struct tsr_gguf {
    const uint8_t *buf;
    uint64_t size;
    tsr_map map;
    uint32_t version;
    int n_kv;
    gguf_kv *kv;
    int *kv_sorted;
    int n_tensors;
    tsr_gguf_tensor_info *ti;
    int *ti_sorted;
    uint64_t alignment;
    uint64_t data_start;
};

/* --- reading -------------------------------------------------------------------------- */

typedef struct reader {
    const uint8_t *buf;
    uint64_t size, pos;
    const char *file;
    tsr_error *err;
} reader;

static int truncated(reader *r, const char *what) {
    return tsr_error_set_at(r->err, TSR_ERR_FORMAT, r->file, 0, 0,
                            "truncated: %s at offset %llu runs past the end of the file "
                            "(%llu bytes)", what, (unsigned long long)r->pos,
                            (unsigned long long)r->size);
}

static int rd_bytes(reader *r, void *dst, uint64_t n, const char *what) {
    if (!tsr_range_in(r->pos, n, r->size)) return truncated(r, what);
    memcpy(dst, r->buf + r->pos, (size_t)n);
    r->pos += n;
    return TSR_OK;
}

static int rd_u32(reader *r, uint32_t *v, const char *what) {
    uint8_t b[4] = {0};
    int rc = rd_bytes(r, b, 4, what);
    if (rc) return rc;
    *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    return TSR_OK;
}

static uint64_t le64(const uint8_t *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

static int rd_u64(reader *r, uint64_t *v, const char *what) {
    uint8_t b[8] = {0};
    int rc = rd_bytes(r, b, 8, what);
    if (rc) return rc;
    *v = le64(b);
    return TSR_OK;
}

/* A string: u64 length then bytes. Sets *off to the bytes' offset. */
static int rd_str(reader *r, uint64_t *off, uint64_t *len, const char *what) {
    int rc = rd_u64(r, len, what);
    if (rc) return rc;
    if (!tsr_range_in(r->pos, *len, r->size)) {
        r->pos -= 8;
        return tsr_error_set_at(r->err, TSR_ERR_FORMAT, r->file, 0, 0,
                                "%s: string length %llu at offset %llu runs past the end of the "
                                "file (%llu bytes)", what, (unsigned long long)*len,
                                (unsigned long long)r->pos, (unsigned long long)r->size);
    }
    *off = r->pos;
    r->pos += *len;
    return TSR_OK;
}

static uint64_t scalar_size(tsr_gguf_type t) {
    switch (t) {
    case TSR_GGUF_UINT8: case TSR_GGUF_INT8: case TSR_GGUF_BOOL: return 1;
    case TSR_GGUF_UINT16: case TSR_GGUF_INT16: return 2;
    case TSR_GGUF_UINT32: case TSR_GGUF_INT32: case TSR_GGUF_FLOAT32: return 4;
    case TSR_GGUF_UINT64: case TSR_GGUF_INT64: case TSR_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

static const char *type_name(uint32_t t) {
    static const char *names[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32",
                                  "float32", "bool", "string", "array", "uint64", "int64",
                                  "float64"};
    return t < 13 ? names[t] : "unknown";
}

static int parse_kv(reader *r, gguf_kv *kv, int idx) {
    char what[96];
    snprintf(what, sizeof what, "key of metadata entry %d", idx);
    uint64_t koff = 0, klen = 0;
    int rc = rd_str(r, &koff, &klen, what);
    if (rc) return rc;
    if (klen == 0 || memchr(r->buf + koff, 0, (size_t)klen))
        return tsr_error_set_at(r->err, TSR_ERR_FORMAT, r->file, 0, 0,
                                "metadata entry %d: key is empty or holds a NUL byte", idx);
    kv->key = malloc((size_t)klen + 1);
    if (!kv->key) return tsr_error_set_at(r->err, TSR_ERR_NOMEM, r->file, 0, 0, "out of memory");
    memcpy(kv->key, r->buf + koff, (size_t)klen);
    kv->key[klen] = '\0';

    char vwhat[GGUF_MAX_NAME + 64];
    snprintf(vwhat, sizeof vwhat, "value of key \"%.*s\"", GGUF_MAX_NAME, kv->key);
    uint32_t type;
    if ((rc = rd_u32(r, &type, vwhat))) return rc;
    if (type > TSR_GGUF_FLOAT64)
        return tsr_error_set_at(r->err, TSR_ERR_FORMAT, r->file, 0, 0,
                                "key \"%s\": unknown value type %u", kv->key, type);
    kv->type = (tsr_gguf_type)type;
    kv->val = r->pos;
    if (type == TSR_GGUF_STRING) {
        uint64_t off, len;
        return rd_str(r, &off, &len, vwhat);
    }
    if (type != TSR_GGUF_ARRAY) {
        uint8_t tmp[8];
        return rd_bytes(r, tmp, scalar_size(kv->type), vwhat);
    }
    uint32_t et;
    if ((rc = rd_u32(r, &et, vwhat))) return rc;
    if ((rc = rd_u64(r, &kv->n, vwhat))) return rc;
    if (et == TSR_GGUF_ARRAY)
        return tsr_error_set_at(r->err, TSR_ERR_UNSUPPORTED, r->file, 0, 0,
                                "key \"%s\": nested arrays are not supported", kv->key);
    if (et > TSR_GGUF_FLOAT64)
        return tsr_error_set_at(r->err, TSR_ERR_FORMAT, r->file, 0, 0,
                                "key \"%s\": unknown array element type %u", kv->key, et);
    kv->elem = (tsr_gguf_type)et;
    kv->data = r->pos;
    uint64_t left = r->size - r->pos;
    if (et == TSR_GGUF_STRING) {
        /* every element needs at least its 8-byte length */
        if (kv->n > left / 8)
            return tsr_error_set_at(r->err, TSR_ERR_FORMAT, r->file, 0, 0,
                                    "key \"%s\": array of %llu strings cannot fit in the %llu "
                                    "bytes left", kv->key, (unsigned long long)kv->n,
                                    (unsigned long long)left);
        if (kv->n) {
            kv->str_offs = malloc((size_t)kv->n * sizeof *kv->str_offs);
            if (!kv->str_offs)
                return tsr_error_set_at(r->err, TSR_ERR_NOMEM, r->file, 0, 0, "out of memory");
        }
        for (uint64_t i = 0; i < kv->n; i++) {
            uint64_t off, len;
            kv->str_offs[i] = r->pos;
            if ((rc = rd_str(r, &off, &len, vwhat))) return rc;
        }
        return TSR_OK;
    }
    uint64_t bytes;
    if (tsr_mul_u64(kv->n, scalar_size(kv->elem), &bytes) || bytes > left)
        return tsr_error_set_at(r->err, TSR_ERR_FORMAT, r->file, 0, 0,
                                "key \"%s\": array of %llu %s elements runs past the end of the "
                                "file", kv->key, (unsigned long long)kv->n, type_name(et));
    r->pos += bytes;
    return TSR_OK;
}

static int parse_tensor(reader *r, tsr_gguf_tensor_info *t, int idx) {
    char what[GGUF_MAX_NAME + 64];
    snprintf(what, sizeof what, "name of tensor info %d", idx);
    uint64_t noff = 0, nlen = 0;
    int rc = rd_str(r, &noff, &nlen, what);
    if (rc) return rc;
    if (nlen == 0 || nlen > GGUF_MAX_NAME || memchr(r->buf + noff, 0, (size_t)nlen))
        return tsr_error_set_at(r->err, TSR_ERR_FORMAT, r->file, 0, 0,
                                "tensor info %d: name of %llu bytes is empty, longer than %d "
                                "bytes or holds a NUL byte", idx, (unsigned long long)nlen,
                                GGUF_MAX_NAME);
    char *name = malloc((size_t)nlen + 1);
    if (!name) return tsr_error_set_at(r->err, TSR_ERR_NOMEM, r->file, 0, 0, "out of memory");
    memcpy(name, r->buf + noff, (size_t)nlen);
    name[nlen] = '\0';
    t->name = name;
    snprintf(what, sizeof what, "tensor info \"%s\"", name);
    uint32_t nd, type;
    if ((rc = rd_u32(r, &nd, what))) return rc;
    if (nd < 1 || nd > 4)
        return tsr_error_set_at(r->err, TSR_ERR_FORMAT, r->file, 0, 0,
                                "tensor \"%s\": n_dims %u is not in 1..4", name, nd);
    t->n_dims = (int)nd;
    for (uint32_t i = 0; i < nd; i++) {
        uint64_t d;
        if ((rc = rd_u64(r, &d, what))) return rc;
        if (d > (uint64_t)INT64_MAX)
            return tsr_error_set_at(r->err, TSR_ERR_FORMAT, r->file, 0, 0,
                                    "tensor \"%s\": dim %u is negative", name, i);
        t->ne[i] = (int64_t)d;
    }
    for (uint32_t i = nd; i < 4; i++) t->ne[i] = 1;
    if ((rc = rd_u32(r, &type, what))) return rc;
    if ((rc = rd_u64(r, &t->offset, what))) return rc; /* relative until fixed up */
    t->ggml_type = type;
    int ti = ggml_type_find(type);
    if (ti < 0)
        return tsr_error_set_at(r->err, TSR_ERR_UNSUPPORTED, r->file, 0, 0,
                                "unsupported ggml type %u for tensor %s", type, name);
    t->dtype = ggml_types[ti].dtype;
    uint64_t count;
    if (tsr_dims_product(t->ne, 4, &count))
        return tsr_error_set_at(r->err, TSR_ERR_FORMAT, r->file, 0, 0,
                                "tensor \"%s\": the product of its dims overflows", name);
    if (t->ne[0] % ggml_types[ti].block != 0)
        return tsr_error_set_at(r->err, TSR_ERR_FORMAT, r->file, 0, 0,
                                "tensor \"%s\": ne[0] = %lld is not a multiple of the %s block "
                                "size %u", name, (long long)t->ne[0], ggml_types[ti].name,
                                ggml_types[ti].block);
    if (tsr_mul_u64(count / ggml_types[ti].block, ggml_types[ti].bytes, &t->nbytes))
        return tsr_error_set_at(r->err, TSR_ERR_FORMAT, r->file, 0, 0,
                                "tensor \"%s\": its size in bytes overflows", name);
    return TSR_OK;
}

/* Sort helpers: an index array ordered by key or name. */
static int cmp_kv_idx(const void *a, const void *b, void *ctx) {
    const tsr_gguf *g = ctx;
    return strcmp(g->kv[*(const int *)a].key, g->kv[*(const int *)b].key);
}
static int cmp_ti_idx(const void *a, const void *b, void *ctx) {
    const tsr_gguf *g = ctx;
    return strcmp(g->ti[*(const int *)a].name, g->ti[*(const int *)b].name);
}
static int cmp_ti_off(const void *a, const void *b, void *ctx) {
    const tsr_gguf *g = ctx;
    const tsr_gguf_tensor_info *x = &g->ti[*(const int *)a];
    const tsr_gguf_tensor_info *y = &g->ti[*(const int *)b];
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return 0;
}

static int parse_all(tsr_gguf *g, reader *r) {
    int rc;
    uint32_t magic;
    uint64_t n_tensors, n_kv;
    if ((rc = rd_u32(r, &magic, "magic"))) return rc;
    if (magic != 0x46554747u) /* "GGUF" little-endian */
        return tsr_error_set_at(r->err, TSR_ERR_FORMAT, r->file, 0, 0,
                                "wrong magic 0x%08x: not a GGUF file", magic);
    if ((rc = rd_u32(r, &g->version, "version"))) return rc;
    if (g->version != 2 && g->version != 3)
        return tsr_error_set_at(r->err, TSR_ERR_UNSUPPORTED, r->file, 0, 0,
                                "unsupported GGUF version %u (2 and 3 are read%s)", g->version,
                                (g->version & 0xffff) == 0 ? "; a big-endian file?" : "");
    if ((rc = rd_u64(r, &n_tensors, "tensor count"))) return rc;
    if ((rc = rd_u64(r, &n_kv, "metadata count"))) return rc;
    uint64_t left = r->size - r->pos;
    if (n_kv > left / 13 || n_kv > INT32_MAX)
        return tsr_error_set_at(r->err, TSR_ERR_FORMAT, r->file, 0, 0,
                                "metadata count %llu cannot fit in the %llu bytes left",
                                (unsigned long long)n_kv, (unsigned long long)left);
    if (n_tensors > left / 32 || n_tensors > INT32_MAX)
        return tsr_error_set_at(r->err, TSR_ERR_FORMAT, r->file, 0, 0,
                                "tensor count %llu cannot fit in the %llu bytes left",
                                (unsigned long long)n_tensors, (unsigned long long)left);
    if (n_kv) {
        g->kv = calloc((size_t)n_kv, sizeof *g->kv);
        g->kv_sorted = malloc((size_t)n_kv * sizeof *g->kv_sorted);
        if (!g->kv || !g->kv_sorted)
            return tsr_error_set_at(r->err, TSR_ERR_NOMEM, r->file, 0, 0, "out of memory");
    }
    for (uint64_t i = 0; i < n_kv; i++) {
        rc = parse_kv(r, &g->kv[i], (int)i);
        g->n_kv = (int)i + 1; /* free what was allocated even on failure */
        if (rc) return rc;
        g->kv_sorted[i] = (int)i;
    }
    if (g->n_kv > 1) qsort_r(g->kv_sorted, (size_t)g->n_kv, sizeof(int), cmp_kv_idx, g);
    for (int i = 1; i < g->n_kv; i++)
        if (strcmp(g->kv[g->kv_sorted[i - 1]].key, g->kv[g->kv_sorted[i]].key) == 0)
            return tsr_error_set_at(r->err, TSR_ERR_FORMAT, r->file, 0, 0,
                                    "duplicate metadata key \"%s\"", g->kv[g->kv_sorted[i]].key);

    g->alignment = 32;
    int ai = tsr_gguf_find(g, "general.alignment");
    if (ai >= 0) {
        int64_t a;
        if (tsr_gguf_get_int(g, ai, &a) || a <= 0 || a > (1 << 30) || (a & (a - 1)) != 0)
            return tsr_error_set_at(r->err, TSR_ERR_FORMAT, r->file, 0, 0,
                                    "key \"general.alignment\" must be a power of two integer "
                                    "in 1..2^30");
        g->alignment = (uint64_t)a;
    }

    if (n_tensors) {
        g->ti = calloc((size_t)n_tensors, sizeof *g->ti);
        g->ti_sorted = malloc((size_t)n_tensors * sizeof *g->ti_sorted);
        if (!g->ti || !g->ti_sorted)
            return tsr_error_set_at(r->err, TSR_ERR_NOMEM, r->file, 0, 0, "out of memory");
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        rc = parse_tensor(r, &g->ti[i], (int)i);
        g->n_tensors = (int)i + 1;
        if (rc) return rc;
        g->ti_sorted[i] = (int)i;
    }
    if (g->n_tensors > 1) qsort_r(g->ti_sorted, (size_t)g->n_tensors, sizeof(int), cmp_ti_idx, g);
    for (int i = 1; i < g->n_tensors; i++)
        if (strcmp(g->ti[g->ti_sorted[i - 1]].name, g->ti[g->ti_sorted[i]].name) == 0)
            return tsr_error_set_at(r->err, TSR_ERR_FORMAT, r->file, 0, 0,
                                    "duplicate tensor name \"%s\"", g->ti[g->ti_sorted[i]].name);

    /* data section: after the tensor infos, rounded up to the alignment */
    uint64_t start;
    if (tsr_add_u64(r->pos, g->alignment - 1, &start))
        return tsr_error_set_at(r->err, TSR_ERR_FORMAT, r->file, 0, 0, "data offset overflows");
    start &= ~(g->alignment - 1);
    g->data_start = start;
    if (g->n_tensors == 0) return TSR_OK;
    if (start > r->size)
        return tsr_error_set_at(r->err, TSR_ERR_FORMAT, r->file, 0, 0,
                                "truncated: the data section would start at %llu, past the end "
                                "of the file (%llu bytes)", (unsigned long long)start,
                                (unsigned long long)r->size);
    for (int i = 0; i < g->n_tensors; i++) {
        tsr_gguf_tensor_info *t = &g->ti[i];
        uint64_t abs;
        if (t->offset % g->alignment != 0)
            return tsr_error_set_at(r->err, TSR_ERR_FORMAT, r->file, 0, 0,
                                    "tensor \"%s\": offset %llu is not a multiple of the "
                                    "alignment %llu", t->name, (unsigned long long)t->offset,
                                    (unsigned long long)g->alignment);
        if (tsr_add_u64(start, t->offset, &abs) || !tsr_range_in(abs, t->nbytes, r->size))
            return tsr_error_set_at(r->err, TSR_ERR_FORMAT, r->file, 0, 0,
                                    "tensor \"%s\": data at offset %llu + %llu bytes lies "
                                    "outside the file (%llu bytes)", t->name,
                                    (unsigned long long)t->offset,
                                    (unsigned long long)t->nbytes, (unsigned long long)r->size);
        t->offset = abs;
        t->data = r->buf + abs;
    }
    int *by_off = malloc((size_t)g->n_tensors * sizeof *by_off);
    if (!by_off) return tsr_error_set_at(r->err, TSR_ERR_NOMEM, r->file, 0, 0, "out of memory");
    for (int i = 0; i < g->n_tensors; i++) by_off[i] = i;
    qsort_r(by_off, (size_t)g->n_tensors, sizeof(int), cmp_ti_off, g);
    rc = TSR_OK;
    const tsr_gguf_tensor_info *last = NULL; /* the non-empty tensor ending furthest */
    for (int i = 0; i < g->n_tensors && !rc; i++) {
        const tsr_gguf_tensor_info *b = &g->ti[by_off[i]];
        if (!b->nbytes) continue;
        if (last && last->offset + last->nbytes > b->offset)
            rc = tsr_error_set_at(r->err, TSR_ERR_FORMAT, r->file, 0, 0,
                                  "tensor \"%s\" overlaps tensor \"%s\"", b->name, last->name);
        if (!last || b->offset + b->nbytes > last->offset + last->nbytes) last = b;
    }
    free(by_off);
    return rc;
}

int tsr_gguf_parse(const void *buf, uint64_t size, const char *name, tsr_gguf **out,
                   tsr_error *err) {
    *out = NULL;
    tsr_gguf *g = calloc(1, sizeof *g);
    const char *file = name ? name : "<memory>";
    if (!g) return tsr_error_set_at(err, TSR_ERR_NOMEM, file, 0, 0, "out of memory");
    g->buf = buf;
    g->size = size;
    reader r = {.buf = buf, .size = size, .pos = 0, .file = file, .err = err};
    int rc = parse_all(g, &r);
    if (rc) {
        tsr_gguf_free(g);
        return rc;
    }
    *out = g;
    return TSR_OK;
}

int tsr_gguf_open(const char *path, tsr_gguf **out, tsr_error *err) {
    *out = NULL;
    tsr_map m;
    int rc = tsr_map_file(path, &m, err);
    if (rc) return rc;
    rc = tsr_gguf_parse(m.addr, m.size, path, out, err);
    if (rc) {
        tsr_map_release(&m);
        return rc;
    }
    (*out)->map = m;
    return TSR_OK;
}

const tsr_map *tsr_gguf_map(const tsr_gguf *g) { return &g->map; }

void tsr_gguf_free(tsr_gguf *g) {
    if (!g) return;
    for (int i = 0; i < g->n_kv; i++) {
        free(g->kv[i].key);
        free(g->kv[i].str_offs);
    }
    for (int i = 0; i < g->n_tensors; i++) free((char *)g->ti[i].name);
    free(g->kv);
    free(g->kv_sorted);
    free(g->ti);
    free(g->ti_sorted);
    tsr_map_release(&g->map);
    free(g);
}

/* --- queries ------------------------------------------------------------------------------ */

int tsr_gguf_n_kv(const tsr_gguf *g) { return g->n_kv; }

int tsr_gguf_find(const tsr_gguf *g, const char *key) {
    int lo = 0, hi = g->n_kv - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(g->kv[g->kv_sorted[mid]].key, key);
        if (c == 0) return g->kv_sorted[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

const char *tsr_gguf_key(const tsr_gguf *g, int idx) {
    return idx >= 0 && idx < g->n_kv ? g->kv[idx].key : NULL;
}

tsr_gguf_type tsr_gguf_kv_type(const tsr_gguf *g, int idx) {
    return idx >= 0 && idx < g->n_kv ? g->kv[idx].type : (tsr_gguf_type)-1;
}

/* Read a scalar of type t at p as int64 (ok) or double. */
static int scalar_int(tsr_gguf_type t, const uint8_t *p, int64_t *out) {
    uint64_t u = 0;
    uint64_t n = scalar_size(t);
    for (uint64_t i = 0; i < n; i++) u |= (uint64_t)p[i] << (8 * i);
    switch (t) {
    case TSR_GGUF_UINT8: case TSR_GGUF_UINT16: case TSR_GGUF_UINT32: *out = (int64_t)u; return 0;
    case TSR_GGUF_INT8: *out = (int8_t)u; return 0;
    case TSR_GGUF_INT16: *out = (int16_t)u; return 0;
    case TSR_GGUF_INT32: *out = (int32_t)u; return 0;
    case TSR_GGUF_INT64: *out = (int64_t)u; return 0;
    case TSR_GGUF_UINT64:
        if (u > (uint64_t)INT64_MAX) return -1;
        *out = (int64_t)u;
        return 0;
    default: return -1;
    }
}

int tsr_gguf_get_int(const tsr_gguf *g, int idx, int64_t *out) {
    if (idx < 0 || idx >= g->n_kv) return -1;
    return scalar_int(g->kv[idx].type, g->buf + g->kv[idx].val, out);
}

int tsr_gguf_get_float(const tsr_gguf *g, int idx, double *out) {
    if (idx < 0 || idx >= g->n_kv) return -1;
    const uint8_t *p = g->buf + g->kv[idx].val;
    if (g->kv[idx].type == TSR_GGUF_FLOAT32) {
        float f;
        memcpy(&f, p, 4);
        *out = f;
        return 0;
    }
    if (g->kv[idx].type == TSR_GGUF_FLOAT64) {
        memcpy(out, p, 8);
        return 0;
    }
    int64_t v;
    if (scalar_int(g->kv[idx].type, p, &v)) return -1;
    *out = (double)v;
    return 0;
}

int tsr_gguf_get_bool(const tsr_gguf *g, int idx, int *out) {
    if (idx < 0 || idx >= g->n_kv || g->kv[idx].type != TSR_GGUF_BOOL) return -1;
    *out = g->buf[g->kv[idx].val] != 0;
    return 0;
}

const char *tsr_gguf_get_str(const tsr_gguf *g, int idx, uint64_t *len) {
    if (idx < 0 || idx >= g->n_kv || g->kv[idx].type != TSR_GGUF_STRING) return NULL;
    if (len) *len = le64(g->buf + g->kv[idx].val);
    return (const char *)g->buf + g->kv[idx].val + 8;
}

int tsr_gguf_get_arr(const tsr_gguf *g, int idx, tsr_gguf_type *elem_type, uint64_t *n,
                     const void **data) {
    if (idx < 0 || idx >= g->n_kv || g->kv[idx].type != TSR_GGUF_ARRAY) return -1;
    if (elem_type) *elem_type = g->kv[idx].elem;
    if (n) *n = g->kv[idx].n;
    if (data) *data = g->buf + g->kv[idx].data;
    return 0;
}

const char *tsr_gguf_get_arr_str(const tsr_gguf *g, int idx, uint64_t i, uint64_t *len) {
    if (idx < 0 || idx >= g->n_kv || g->kv[idx].type != TSR_GGUF_ARRAY ||
        g->kv[idx].elem != TSR_GGUF_STRING || i >= g->kv[idx].n)
        return NULL;
    uint64_t off = g->kv[idx].str_offs[i];
    if (len) *len = le64(g->buf + off);
    return (const char *)g->buf + off + 8;
}

int tsr_gguf_n_tensors(const tsr_gguf *g) { return g->n_tensors; }

const tsr_gguf_tensor_info *tsr_gguf_tensor(const tsr_gguf *g, int i) {
    return i >= 0 && i < g->n_tensors ? &g->ti[i] : NULL;
}

int tsr_gguf_find_tensor(const tsr_gguf *g, const char *name) {
    int lo = 0, hi = g->n_tensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(g->ti[g->ti_sorted[mid]].name, name);
        if (c == 0) return g->ti_sorted[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}
