#include "safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/dtype.h"
#include "../util/checked.h"
#include "format_internal.h"

struct tsr_safetensors {
    tsr_map map; /* owned mapping, empty when parsed from a caller's buffer */
    tsr_tensor_table tab;
    json_t *meta; /* the __metadata__ object or NULL */
};

static const struct {
    const char *name;
    uint32_t dtype;
} st_dtypes[] = {
    {"F32", TSR_DTYPE_F32},   {"F16", TSR_DTYPE_F16}, {"BF16", TSR_DTYPE_BF16},
    {"F8_E4M3", TSR_DTYPE_F8_E4M3}, {"I8", TSR_DTYPE_I8},   {"I32", TSR_DTYPE_I32},
    {"I64", TSR_DTYPE_I64},
};

const char *tsr_safetensors_dtype_name(uint32_t dtype) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (st_dtypes[i].dtype == dtype) return st_dtypes[i].name;
    return NULL;
}

static uint32_t st_dtype_from(const char *s) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strcmp(st_dtypes[i].name, s) == 0) return st_dtypes[i].dtype;
    return TSR_DTYPE_COUNT;
}

/* Reads a JSON integer >= 0 into *out. */
static int json_u64(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v)) return -1;
    json_int_t x = json_integer_value(v);
    if (x < 0) return -1;
    *out = (uint64_t)x;
    return 0;
}

typedef struct span {
    uint64_t begin, end;
    int idx;
} span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* One header entry: validate and add to the table. */
static int parse_entry(tsr_safetensors *st, const char *file, const char *key, json_t *v,
                       const uint8_t *data, uint64_t data_size, tsr_error *err) {
    if (!json_is_object(v))
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                "tensor \"%s\": entry is not an object", key);
    json_t *jd = json_object_get(v, "dtype");
    json_t *js = json_object_get(v, "shape");
    json_t *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd))
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                "tensor \"%s\": missing or non-string field \"dtype\"", key);
    if (!json_is_array(js))
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                "tensor \"%s\": missing or non-array field \"shape\"", key);
    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                "tensor \"%s\": field \"data_offsets\" must be [begin, end]", key);
    uint32_t dtype = st_dtype_from(json_string_value(jd));
    if (dtype == TSR_DTYPE_COUNT)
        return tsr_error_set_at(err, TSR_ERR_UNSUPPORTED, file, 0, 0,
                                "tensor \"%s\": unsupported dtype \"%s\"", key,
                                json_string_value(jd));
    size_t nd = json_array_size(js);
    if (nd > 4)
        return tsr_error_set_at(err, TSR_ERR_UNSUPPORTED, file, 0, 0,
                                "tensor \"%s\": field \"shape\" has %zu dims (at most 4)", key,
                                nd);
    tsr_tensor t = {0};
    t.dtype = dtype;
    t.n_dims = (int)nd;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (json_u64(json_array_get(js, i), &d) || d > (uint64_t)INT64_MAX)
            return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                    "tensor \"%s\": field \"shape\"[%zu] is not an integer >= 0",
                                    key, i);
        t.shape[i] = (int64_t)d;
    }
    uint64_t begin, end, count, bytes;
    if (json_u64(json_array_get(jo, 0), &begin) || json_u64(json_array_get(jo, 1), &end))
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                "tensor \"%s\": field \"data_offsets\" holds a non-integer or "
                                "negative value", key);
    if (begin > end || end > data_size)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                "tensor \"%s\": field \"data_offsets\" [%llu, %llu] outside the "
                                "data section of %llu bytes", key, (unsigned long long)begin,
                                (unsigned long long)end, (unsigned long long)data_size);
    if (tsr_dims_product(t.shape, t.n_dims, &count) ||
        tsr_mul_u64(count, (uint64_t)tsr_dtype_block_bytes(dtype), &bytes))
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                "tensor \"%s\": field \"shape\": element count overflows", key);
    if (bytes != end - begin)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                "tensor \"%s\": field \"shape\" needs %llu bytes of %s but "
                                "data_offsets span %llu", key, (unsigned long long)bytes,
                                json_string_value(jd), (unsigned long long)(end - begin));
    t.data = data + begin;
    t.nbytes = bytes;
    if (tsr_table_add(&st->tab, key, &t))
        return tsr_error_set_at(err, TSR_ERR_NOMEM, file, 0, 0, "out of memory");
    return TSR_OK;
}

int tsr_safetensors_parse(const void *buf, uint64_t size, const char *name,
                          tsr_safetensors **out, tsr_error *err) {
    *out = NULL;
    const char *file = name ? name : "<memory>";
    const uint8_t *b = buf;
    if (size < 8)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                "file of %llu bytes is too short for the 8-byte header length",
                                (unsigned long long)size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | b[i];
    if (hlen > TSR_SAFETENSORS_MAX_HEADER)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                "header length %llu exceeds the limit of %u bytes",
                                (unsigned long long)hlen, TSR_SAFETENSORS_MAX_HEADER);
    if (!tsr_range_in(8, hlen, size))
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                "header length %llu runs past the end of the file (%llu bytes)",
                                (unsigned long long)hlen, (unsigned long long)size);
    const uint8_t *data = b + 8 + hlen;
    uint64_t data_size = size - 8 - hlen;

    json_error_t jerr;
    json_t *root = json_loadb((const char *)b + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, jerr.line > 0 ? jerr.line : 0,
                                jerr.column > 0 ? jerr.column : 0, "header JSON: %s", jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0, "header is not a JSON object");
    }
    tsr_safetensors *st = calloc(1, sizeof *st);
    if (!st) {
        json_decref(root);
        return tsr_error_set_at(err, TSR_ERR_NOMEM, file, 0, 0, "out of memory");
    }
    int rc = TSR_OK;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(v)) {
                rc = tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                      "field \"__metadata__\" is not an object");
                break;
            }
            st->meta = json_incref(v);
            continue;
        }
        rc = parse_entry(st, file, key, v, data, data_size, err);
        if (rc) break;
    }
    json_decref(root);
    if (rc) {
        tsr_safetensors_free(st);
        return rc;
    }
    tsr_table_sort(&st->tab); /* names are unique: JSON_REJECT_DUPLICATES */

    /* The tensors must tile the data section: sorted by offset, each starts
     * where the previous ended. */
    span *sp = st->tab.n ? malloc((size_t)st->tab.n * sizeof *sp) : NULL;
    if (st->tab.n && !sp) {
        tsr_safetensors_free(st);
        return tsr_error_set_at(err, TSR_ERR_NOMEM, file, 0, 0, "out of memory");
    }
    for (int i = 0; i < st->tab.n; i++) {
        sp[i].begin = (uint64_t)((const uint8_t *)st->tab.t[i].data - data);
        sp[i].end = sp[i].begin + st->tab.t[i].nbytes;
        sp[i].idx = i;
    }
    if (st->tab.n > 1) qsort(sp, (size_t)st->tab.n, sizeof *sp, cmp_span);
    uint64_t pos = 0;
    for (int i = 0; i < st->tab.n && !rc; i++) {
        const char *tn = st->tab.t[sp[i].idx].name;
        if (sp[i].begin < pos)
            rc = tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                  "tensor \"%s\": data_offsets [%llu, %llu] overlap tensor \"%s\"",
                                  tn, (unsigned long long)sp[i].begin,
                                  (unsigned long long)sp[i].end,
                                  st->tab.t[sp[i - 1].idx].name);
        else if (sp[i].begin > pos)
            rc = tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                  "tensor \"%s\": data_offsets begin at %llu, leaving a gap "
                                  "after byte %llu of the data section", tn,
                                  (unsigned long long)sp[i].begin, (unsigned long long)pos);
        pos = sp[i].end;
    }
    if (!rc && pos != data_size)
        rc = tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                              "tensors cover %llu bytes but the data section holds %llu",
                              (unsigned long long)pos, (unsigned long long)data_size);
    free(sp);
    if (rc) {
        tsr_safetensors_free(st);
        return rc;
    }
    *out = st;
    return TSR_OK;
}

int tsr_safetensors_open(const char *path, tsr_safetensors **out, tsr_error *err) {
    *out = NULL;
    tsr_map m;
    int rc = tsr_map_file(path, &m, err);
    if (rc) return rc;
    rc = tsr_safetensors_parse(m.addr, m.size, path, out, err);
    if (rc) {
        tsr_map_release(&m);
        return rc;
    }
    (*out)->map = m;
    return TSR_OK;
}

void tsr_safetensors_free(tsr_safetensors *st) {
    if (!st) return;
    tsr_table_free(&st->tab);
    if (st->meta) json_decref(st->meta);
    tsr_map_release(&st->map);
    free(st);
}

int tsr_safetensors_n_tensors(const tsr_safetensors *st) { return st->tab.n; }

const tsr_map *tsr_safetensors_map(const tsr_safetensors *st) { return &st->map; }

const tsr_tensor *tsr_safetensors_tensor_at(const tsr_safetensors *st, int i) {
    return i >= 0 && i < st->tab.n ? &st->tab.t[i] : NULL;
}

const tsr_tensor *tsr_safetensors_find(const tsr_safetensors *st, const char *name) {
    return tsr_table_find(&st->tab, name);
}

const char *tsr_safetensors_metadata(const tsr_safetensors *st, const char *key) {
    if (!st->meta) return NULL;
    return json_string_value(json_object_get(st->meta, key));
}

/* --- writer ------------------------------------------------------------------------ */

int tsr_safetensors_write(const char *path, const tsr_tensor *tensors, int n,
                          const char *const *meta, tsr_error *err) {
    json_t *root = json_object();
    if (!root) return tsr_error_set_at(err, TSR_ERR_NOMEM, path, 0, 0, "out of memory");
    int rc = TSR_OK;
    if (meta && meta[0]) {
        json_t *m = json_object();
        for (int i = 0; m && meta[i] && meta[i + 1]; i += 2)
            json_object_set_new(m, meta[i], json_string(meta[i + 1]));
        json_object_set_new(root, "__metadata__", m);
    }
    uint64_t off = 0;
    for (int i = 0; i < n && !rc; i++) {
        const tsr_tensor *t = &tensors[i];
        const char *dn = tsr_safetensors_dtype_name(t->dtype);
        uint64_t count, bytes;
        if (!dn) {
            rc = tsr_error_set_at(err, TSR_ERR_UNSUPPORTED, path, 0, 0,
                                  "tensor \"%s\": dtype %s has no safetensors spelling", t->name,
                                  tsr_dtype_name(t->dtype));
            break;
        }
        if (t->n_dims < 0 || t->n_dims > 4 || tsr_dims_product(t->shape, t->n_dims, &count) ||
            tsr_mul_u64(count, (uint64_t)tsr_dtype_block_bytes(t->dtype), &bytes) ||
            bytes != t->nbytes) {
            rc = tsr_error_set_at(err, TSR_ERR_INVALID, path, 0, 0,
                                  "tensor \"%s\": shape does not match nbytes %llu", t->name,
                                  (unsigned long long)t->nbytes);
            break;
        }
        if (json_object_get(root, t->name)) {
            rc = tsr_error_set_at(err, TSR_ERR_INVALID, path, 0, 0, "duplicate tensor name \"%s\"",
                                  t->name);
            break;
        }
        json_t *e = json_object(), *shape = json_array(), *offs = json_array();
        for (int d = 0; d < t->n_dims; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + bytes)));
        json_object_set_new(e, "dtype", json_string(dn));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", offs);
        if (json_object_set_new(root, t->name, e))
            rc = tsr_error_set_at(err, TSR_ERR_NOMEM, path, 0, 0, "out of memory");
        off += bytes;
    }
    char *hdr = rc ? NULL : json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (rc) return rc;
    if (!hdr) return tsr_error_set_at(err, TSR_ERR_NOMEM, path, 0, 0, "out of memory");
    size_t hl = strlen(hdr), padded = (hl + 7) & ~(size_t)7;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        free(hdr);
        return tsr_error_set_at(err, TSR_ERR_IO, tmp, 0, 0, "cannot create: %s", strerror(errno));
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int ok = fwrite(len8, 1, 8, fp) == 8 && fwrite(hdr, 1, hl, fp) == hl;
    for (size_t i = hl; ok && i < padded; i++) ok = fputc(' ', fp) != EOF;
    for (int i = 0; ok && i < n; i++)
        ok = tensors[i].nbytes == 0 ||
             fwrite(tensors[i].data, 1, (size_t)tensors[i].nbytes, fp) == tensors[i].nbytes;
    free(hdr);
    if (fclose(fp) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return tsr_error_set_at(err, TSR_ERR_IO, path, 0, 0, "write failed: %s", strerror(errno));
    }
    return TSR_OK;
}
