#include "model_file.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../../kernels/dtype.h"
#include "../util/checked.h"
#include "format_internal.h"
#include "safetensors.h"

struct tsr_model_file {
    tsr_model_format format;
    tsr_model_config cfg;
    tsr_tensor_table tab;
    tsr_safetensors **shards;
    int n_shards;
    tsr_gguf *gguf;
    tsr_map map; /* llama2.c */
    char *path;
    char *dir;
    uint64_t bytes;
    float *scales; /* FP8 checkpoints: every scale widened to f32 */
};

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static char *dirname_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

static int nomem(tsr_error *err, const char *file) {
    return tsr_error_set_at(err, TSR_ERR_NOMEM, file, 0, 0, "out of memory");
}

static int add_tensor(tsr_model_file *f, const char *name, const tsr_tensor *t, tsr_error *err) {
    if (tsr_table_add(&f->tab, name, t)) return nomem(err, f->path);
    return TSR_OK;
}

/* --- safetensors ---------------------------------------------------------------------- */

static int add_shard(tsr_model_file *f, const char *path, tsr_error *err) {
    tsr_safetensors **ns = realloc(f->shards, (size_t)(f->n_shards + 1) * sizeof *ns);
    if (!ns) return nomem(err, path);
    f->shards = ns;
    int rc = tsr_safetensors_open(path, &f->shards[f->n_shards], err);
    if (rc) return rc;
    tsr_safetensors *st = f->shards[f->n_shards++];
    for (int i = 0; i < tsr_safetensors_n_tensors(st); i++) {
        const tsr_tensor *t = tsr_safetensors_tensor_at(st, i);
        if ((rc = add_tensor(f, t->name, t, err))) return rc;
    }
    return TSR_OK;
}

static int open_sharded(tsr_model_file *f, const char *index, tsr_error *err) {
    json_error_t je;
    json_t *root = json_load_file(index, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, index, je.line > 0 ? je.line : 0,
                                je.column > 0 ? je.column : 0, "%s", je.text);
    int rc = TSR_OK;
    json_t *wm = json_object_get(root, "weight_map");
    const char **files = NULL;
    size_t n_files = 0;
    if (!json_is_object(wm) || json_object_size(wm) == 0) {
        rc = tsr_error_set_at(err, TSR_ERR_FORMAT, index, 0, 0,
                              "missing or empty field \"weight_map\"");
        goto done;
    }
    files = calloc(json_object_size(wm), sizeof *files);
    if (!files) {
        rc = nomem(err, index);
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        const char *fn = json_string_value(v);
        if (!fn || !fn[0] || strchr(fn, '/') || fn[0] == '.') {
            rc = tsr_error_set_at(err, TSR_ERR_FORMAT, index, 0, 0,
                                  "field \"weight_map\".\"%s\": shard must be a plain file name "
                                  "in the same folder", key);
            goto done;
        }
        size_t i = 0;
        while (i < n_files && strcmp(files[i], fn) != 0) i++;
        if (i == n_files) files[n_files++] = fn;
    }
    for (size_t i = 0; i < n_files && !rc; i++) {
        char *p = join(f->dir, files[i]);
        if (!p) {
            rc = nomem(err, index);
            break;
        }
        rc = add_shard(f, p, err);
        free(p);
    }
    if (rc) goto done;
    const char *dup = tsr_table_sort(&f->tab);
    if (dup) {
        rc = tsr_error_set_at(err, TSR_ERR_FORMAT, index, 0, 0,
                              "tensor \"%s\" is stored in more than one shard", dup);
        goto done;
    }
    json_object_foreach(wm, key, v) {
        size_t i = 0;
        while (i < n_files && strcmp(files[i], json_string_value(v)) != 0) i++;
        if (!tsr_safetensors_find(f->shards[i], key)) {
            rc = tsr_error_set_at(err, TSR_ERR_FORMAT, index, 0, 0,
                                  "tensor \"%s\" listed in \"weight_map\" is not in shard %s",
                                  key, files[i]);
            goto done;
        }
    }
done:
    free(files);
    json_decref(root);
    return rc;
}

/* --- GGUF --------------------------------------------------------------------------------- */

static int open_gguf(tsr_model_file *f, tsr_error *err) {
    int rc = tsr_gguf_open(f->path, &f->gguf, err);
    if (rc) return rc;
    if ((rc = tsr_config_from_gguf(f->gguf, f->path, &f->cfg, err))) return rc;
    int mix = f->cfg.arch == TSR_ARCH_MIXTRAL;
    for (int i = 0; i < tsr_gguf_n_tensors(f->gguf); i++) {
        const tsr_gguf_tensor_info *gi = tsr_gguf_tensor(f->gguf, i);
        if (gi->dtype >= TSR_DTYPE_COUNT)
            return tsr_error_set_at(err, TSR_ERR_UNSUPPORTED, f->path, 0, 0,
                                    "unsupported ggml type %u for tensor %s", gi->ggml_type,
                                    gi->name);
        tsr_tensor t = {0};
        t.dtype = gi->dtype;
        t.n_dims = gi->n_dims;
        for (int d = 0; d < gi->n_dims; d++) t.shape[d] = gi->ne[gi->n_dims - 1 - d];
        t.data = gi->data;
        t.nbytes = gi->nbytes;
        unsigned layer;
        char which[8];
        int n = 0;
        if (sscanf(gi->name, "blk.%u.ffn_%4[a-z]_exps.weight%n", &layer, which, &n) == 2 &&
            gi->name[n] == '\0') {
            /* merged experts [E, rows, cols]: one 2-D view per expert */
            const char *hf = NULL;
            if (strcmp(which, "gate") == 0) hf = mix ? "w1" : "gate_proj";
            if (strcmp(which, "down") == 0) hf = mix ? "w2" : "down_proj";
            if (strcmp(which, "up") == 0) hf = mix ? "w3" : "up_proj";
            if (!hf || gi->n_dims != 3 || gi->ne[2] == 0)
                return tsr_error_set_at(err, TSR_ERR_FORMAT, f->path, 0, 0,
                                        "tensor \"%s\": expected a 3-D merged expert tensor",
                                        gi->name);
            int64_t ne = gi->ne[2];
            uint64_t per = gi->nbytes / (uint64_t)ne;
            tsr_tensor v = t;
            v.n_dims = 2;
            v.shape[0] = gi->ne[1];
            v.shape[1] = gi->ne[0];
            v.shape[2] = v.shape[3] = 0;
            v.nbytes = per;
            for (int64_t e = 0; e < ne; e++) {
                char name[160];
                snprintf(name, sizeof name, "model.layers.%u.%s.%lld.%s.weight", layer,
                         mix ? "block_sparse_moe.experts" : "mlp.experts", (long long)e, hf);
                v.data = (const uint8_t *)gi->data + (uint64_t)e * per;
                if ((rc = add_tensor(f, name, &v, err))) return rc;
            }
            continue;
        }
        char name[192];
        if (!tsr_gguf_name_to_hf(gi->name, f->cfg.arch, name, sizeof name))
            snprintf(name, sizeof name, "%s", gi->name); /* kept under its GGUF name */
        if (t.n_dims == 1 && ends_with(name, ".shared_expert_gate.weight")) {
            t.n_dims = 2; /* GGUF stores [hidden]; transformers [1, hidden] */
            t.shape[1] = t.shape[0];
            t.shape[0] = 1;
        }
        if ((rc = add_tensor(f, name, &t, err))) return rc;
    }
    const char *dup = tsr_table_sort(&f->tab);
    if (dup)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, f->path, 0, 0,
                                "two GGUF tensors map onto \"%s\"", dup);
    return TSR_OK;
}

/* --- llama2.c ------------------------------------------------------------------------------ */

static int open_llama2c(tsr_model_file *f, tsr_error *err) {
    int rc = tsr_map_file(f->path, &f->map, err);
    if (rc) return rc;
    const uint8_t *b = f->map.addr;
    if (f->map.size < 28)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, f->path, 0, 0,
                                "file of %llu bytes is too short for the 28-byte llama2.c header",
                                (unsigned long long)f->map.size);
    int32_t h[7];
    memcpy(h, b, sizeof h);
    static const char *fields[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads",
                                    "vocab_size", "seq_len"};
    for (int i = 0; i < 7; i++)
        if (h[i] == 0 || (h[i] < 0 && i != 5) || h[i] == INT32_MIN)
            return tsr_error_set_at(err, TSR_ERR_FORMAT, f->path, 0, 0,
                                    "header field \"%s\" = %d must be > 0", fields[i], h[i]);
    int shared = h[5] > 0;
    const int64_t dim = h[0], hid = h[1], L = h[2], nh = h[3], nkv = h[4];
    const int64_t V = shared ? h[5] : -(int64_t)h[5], seq = h[6];
    if (L > TSR_MAX_LAYERS || dim % nh != 0 || nkv > nh || nh % nkv != 0 || (dim / nh) % 2)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, f->path, 0, 0,
                                "header: n_layers %lld, dim %lld, n_heads %lld, n_kv_heads %lld "
                                "are inconsistent", (long long)L, (long long)dim, (long long)nh,
                                (long long)nkv);
    const int64_t hd = dim / nh, kvd = nkv * hd;
    tsr_model_config *c = &f->cfg;
    memset(c, 0, sizeof *c);
    c->arch = TSR_ARCH_LLAMA;
    snprintf(c->arch_name, sizeof c->arch_name, "llama");
    c->vocab = (int)V;
    c->hidden = (int)dim;
    c->n_layers = (int)L;
    c->n_heads = (int)nh;
    c->n_kv_heads = (int)nkv;
    c->head_dim = (int)hd;
    c->ffn = (int)hid;
    c->max_ctx = (int)seq;
    c->norm_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    c->rope_interleaved = 1;
    c->rope_factor = 1.0f;
    c->tie_embeddings = shared;
    c->bos = 1;
    c->eos[0] = 2;
    c->n_eos = 1;
    c->dtype = TSR_DTYPE_F32;

    /* weights in llama2.c's order, each [rows, cols] per layer */
    uint64_t off = 28;
    struct {
        const char *name; /* %d: layer, or no layer */
        int per_layer;
        int64_t rows, cols; /* cols 0: 1-D */
    } order[] = {
        {"model.embed_tokens.weight", 0, V, dim},
        {"model.layers.%d.input_layernorm.weight", 1, dim, 0},
        {"model.layers.%d.self_attn.q_proj.weight", 1, nh * hd, dim},
        {"model.layers.%d.self_attn.k_proj.weight", 1, kvd, dim},
        {"model.layers.%d.self_attn.v_proj.weight", 1, kvd, dim},
        {"model.layers.%d.self_attn.o_proj.weight", 1, dim, nh * hd},
        {"model.layers.%d.post_attention_layernorm.weight", 1, dim, 0},
        {"model.layers.%d.mlp.gate_proj.weight", 1, hid, dim},
        {"model.layers.%d.mlp.down_proj.weight", 1, dim, hid},
        {"model.layers.%d.mlp.up_proj.weight", 1, hid, dim},
        {"model.norm.weight", 0, dim, 0},
        {NULL, 0, seq, hd}, /* freq_cis_real and _imag: [seq, hd/2] each, skipped */
        {"lm_head.weight", 0, V, dim},
    };
    int n_order = (int)(sizeof order / sizeof order[0]) - (shared ? 1 : 0);
    for (int k = 0; k < n_order; k++) {
        int reps = order[k].per_layer ? (int)L : 1;
        uint64_t elems, bytes;
        int64_t dims[2] = {order[k].rows, order[k].cols ? order[k].cols : 1};
        if (tsr_dims_product(dims, 2, &elems) || tsr_mul_u64(elems, 4, &bytes))
            return tsr_error_set_at(err, TSR_ERR_FORMAT, f->path, 0, 0, "header sizes overflow");
        for (int l = 0; l < reps; l++) {
            if (!tsr_range_in(off, bytes, f->map.size))
                return tsr_error_set_at(err, TSR_ERR_FORMAT, f->path, 0, 0,
                                        "truncated: the weights need more than the file's %llu "
                                        "bytes (the header says dim %lld, hidden_dim %lld, "
                                        "n_layers %lld, vocab %lld)",
                                        (unsigned long long)f->map.size, (long long)dim,
                                        (long long)hid, (long long)L, (long long)V);
            if (order[k].name) {
                char name[128];
                snprintf(name, sizeof name, order[k].name, l);
                tsr_tensor t = {0};
                t.dtype = TSR_DTYPE_F32;
                t.n_dims = order[k].cols ? 2 : 1;
                t.shape[0] = order[k].rows;
                t.shape[1] = order[k].cols;
                t.data = b + off;
                t.nbytes = bytes;
                if ((rc = add_tensor(f, name, &t, err))) return rc;
            }
            off += bytes;
        }
    }
    if (off != f->map.size)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, f->path, 0, 0,
                                "file holds %llu bytes but its header describes %llu",
                                (unsigned long long)f->map.size, (unsigned long long)off);
    tsr_table_sort(&f->tab);
    return TSR_OK;
}

/* --- open ----------------------------------------------------------------------------------- */

static int is_gguf_file(const char *path) {
    FILE *fp = fopen(path, "rb");
    char m[4] = {0};
    if (!fp) return 0;
    size_t n = fread(m, 1, 4, fp);
    fclose(fp);
    return n == 4 && memcmp(m, "GGUF", 4) == 0;
}

int tsr_model_file_open(const char *path, tsr_model_file **out, tsr_error *err) {
    *out = NULL;
    struct stat st;
    if (!path || stat(path, &st) != 0)
        return tsr_error_set_at(err, TSR_ERR_IO, path ? path : "", 0, 0, "cannot open: %s",
                                path ? strerror(errno) : "no path");
    tsr_model_file *f = calloc(1, sizeof *f);
    if (!f) return nomem(err, path);
    int rc = TSR_OK;
    f->path = strdup(path);
    f->dir = S_ISDIR(st.st_mode) ? strdup(path) : dirname_of(path);
    if (!f->path || !f->dir) {
        rc = nomem(err, path);
        goto fail;
    }
    char *cfg_path = NULL, *weights = NULL;
    if (S_ISDIR(st.st_mode)) {
        char *idx = join(path, "model.safetensors.index.json");
        char *one = join(path, "model.safetensors");
        if (!idx || !one) {
            free(idx);
            free(one);
            rc = nomem(err, path);
            goto fail;
        }
        struct stat s2;
        if (stat(idx, &s2) == 0) {
            weights = idx;
            free(one);
        } else if (stat(one, &s2) == 0) {
            weights = one;
            free(idx);
        } else {
            free(idx);
            free(one);
            rc = tsr_error_set_at(err, TSR_ERR_IO, path, 0, 0,
                                  "folder holds neither model.safetensors nor "
                                  "model.safetensors.index.json");
            goto fail;
        }
    } else if (ends_with(path, ".gguf") || is_gguf_file(path)) {
        f->format = TSR_FORMAT_GGUF;
        if ((rc = open_gguf(f, err))) goto fail;
    } else if (ends_with(path, ".safetensors") || ends_with(path, ".index.json")) {
        weights = strdup(path);
        if (!weights) {
            rc = nomem(err, path);
            goto fail;
        }
    } else if (ends_with(path, ".bin")) {
        f->format = TSR_FORMAT_LLAMA2C;
        if ((rc = open_llama2c(f, err))) goto fail;
    } else {
        rc = tsr_error_set_at(err, TSR_ERR_UNSUPPORTED, path, 0, 0,
                              "unknown model format (expected a folder, .safetensors, "
                              ".index.json, .gguf or llama2.c .bin)");
        goto fail;
    }
    if (weights) {
        f->format = TSR_FORMAT_SAFETENSORS;
        cfg_path = join(f->dir, "config.json");
        if (!cfg_path) {
            free(weights);
            rc = nomem(err, path);
            goto fail;
        }
        rc = tsr_model_config_load(cfg_path, &f->cfg, err);
        if (!rc) {
            if (ends_with(weights, ".index.json")) {
                rc = open_sharded(f, weights, err);
            } else {
                rc = add_shard(f, weights, err);
                if (!rc) tsr_table_sort(&f->tab);
            }
        }
        free(weights);
        if (!rc) rc = tsr_config_check_tensors(&f->cfg, &f->tab, cfg_path, err);
        if (!rc) rc = tsr_fp8_scales_attach(&f->tab, &f->cfg, f->path, &f->scales, err);
        free(cfg_path);
        if (rc) goto fail;
    } else if ((rc = tsr_config_check_tensors(&f->cfg, &f->tab, f->path, err))) {
        goto fail;
    }
    for (int i = 0; i < f->tab.n; i++) f->bytes += f->tab.t[i].nbytes;
    *out = f;
    return TSR_OK;
fail:
    tsr_model_file_close(f);
    return rc;
}

void tsr_model_file_close(tsr_model_file *f) {
    if (!f) return;
    tsr_table_free(&f->tab);
    free(f->scales);
    for (int i = 0; i < f->n_shards; i++) tsr_safetensors_free(f->shards[i]);
    free(f->shards);
    tsr_gguf_free(f->gguf);
    tsr_map_release(&f->map);
    free(f->path);
    free(f->dir);
    free(f);
}

/* The mapping of f that holds [p, p + n): a shard's, the GGUF's or the
 * llama2.c file's; NULL when none does. */
static const tsr_map *map_holding(const tsr_model_file *f, const void *p, uint64_t n) {
    for (int i = 0; i < f->n_shards; i++)
        if (tsr_map_holds(tsr_safetensors_map(f->shards[i]), p, n)) return tsr_safetensors_map(f->shards[i]);
    if (f->gguf && tsr_map_holds(tsr_gguf_map(f->gguf), p, n)) return tsr_gguf_map(f->gguf);
    return tsr_map_holds(&f->map, p, n) ? &f->map : NULL;
}

uint64_t tsr_model_file_give_back(const tsr_model_file *f, const void *p, uint64_t n) {
    const tsr_map *m = map_holding(f, p, n);
    return m ? tsr_map_give_back(m, p, n) : 0;
}

int tsr_model_file_read(const tsr_model_file *f, const void *p, uint64_t n, void *dst) {
    const tsr_map *m = map_holding(f, p, n);
    return m ? tsr_map_read(m, p, n, dst) : 0;
}

const tsr_model_config *tsr_model_file_config(const tsr_model_file *f) { return &f->cfg; }
tsr_model_format tsr_model_file_format(const tsr_model_file *f) { return f->format; }

const tsr_tensor *tsr_model_file_tensor(const tsr_model_file *f, const char *name) {
    return tsr_table_find(&f->tab, name);
}

int tsr_model_file_n_tensors(const tsr_model_file *f) { return f->tab.n; }

const tsr_tensor *tsr_model_file_tensor_at(const tsr_model_file *f, int i) {
    return i >= 0 && i < f->tab.n ? &f->tab.t[i] : NULL;
}

const char *tsr_model_file_dir(const tsr_model_file *f) { return f->dir; }
const char *tsr_model_file_path(const tsr_model_file *f) { return f->path; }
const struct tsr_gguf *tsr_model_file_gguf(const tsr_model_file *f) { return f->gguf; }
uint64_t tsr_model_file_bytes(const tsr_model_file *f) { return f->bytes; }
