/*
 * mk_fp8_checkpoint - an FP8 E4M3 checkpoint from a safetensors checkpoint,
 * for tests: each projection (names ending in _proj.weight, and the experts'
 * w1/w2/w3) becomes F8_E4M3 with its scale companion as real checkpoints
 * store them (docs/FORMATS.md), every other tensor is copied as it is.
 *
 *   mk_fp8_checkpoint SRC DST --style tensor|channel|block [--block R,C]
 *                     [--scale-dtype f32|bf16] [--static-input-scales] [--lm-head] [--dequant DIR]
 *
 * SRC is a folder with config.json and model.safetensors, or shards listed by
 * model.safetensors.index.json (f32, f16 or bf16); DST gets one
 * model.safetensors, config.json and SRC's tokenizer files.
 *   tensor   X.weight_scale f32 [1], compressed-tensors "strategy": "tensor"
 *   channel  X.weight_scale [rows, 1], compressed-tensors "strategy": "channel"
 *   block    X.weight_scale_inv f32 [ceil(rows/R), ceil(cols/C)], quant_method
 *            "fp8" with "weight_block_size": [R, C] (default 128,128)
 * Scales are max|w| / 448 over the tensor, row or block (1 where that is 0),
 * rounded to the scale dtype; codes are e4m3(w / scale), round to nearest
 * even, saturating at 448 (tsr_f32_to_f8e4m3). Activations are declared
 * dynamic, or with --static-input-scales static with an X.input_scale of 1
 * per projection (which tessera refuses). --lm-head converts lm_head.weight
 * too (real checkpoints keep it in bf16; a GPU test wants every gemv weight
 * stored as FP8, none quantised at load). --dequant DIR also writes the
 * dequantised checkpoint: each projection as f32 fp8 * scale (one f32
 * product, as ref_gemv computes it) and the original config.json.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/format/safetensors.h"
#include "kernels/dtype.h"

typedef enum { STYLE_TENSOR, STYLE_CHANNEL, STYLE_BLOCK } style_t;

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int is_projection(const tsr_tensor *t, int lm_head) {
    if (t->n_dims != 2) return 0;
    if (lm_head && !strcmp(t->name, "lm_head.weight")) return 1;
    return ends_with(t->name, "_proj.weight") || ends_with(t->name, ".w1.weight") ||
           ends_with(t->name, ".w2.weight") || ends_with(t->name, ".w3.weight");
}

static void die(const char *fmt, const char *arg) {
    fprintf(stderr, "mk_fp8_checkpoint: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n");
    exit(2);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) die("out of memory%s", "");
    return p;
}

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = xmalloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* Scale of max|w| over a block, rounded to the scale dtype. */
static float block_scale(float amax, int bf16) {
    float s = amax / 448.0f;
    if (!(s > 0.0f)) s = 1.0f;
    return bf16 ? tsr_bf16_to_f32(tsr_f32_to_bf16(s)) : s;
}

/* Everything one quantised projection adds: the codes, the scales and the
 * dequantised f32 weights. */
typedef struct quant {
    uint8_t *q;
    float *s;
    int64_t grid[2], block[2];
    float *deq;
} quant;

static quant quantise(const tsr_tensor *t, style_t style, int64_t br, int64_t bc, int bf16) {
    const int64_t R = t->shape[0], C = t->shape[1];
    float *w = xmalloc((size_t)(R * C) * sizeof(float));
    uint64_t rb;
    if (tsr_dtype_row_bytes(t->dtype, C, &rb) != 0) die("%s: row size", t->name);
    for (int64_t r = 0; r < R; r++)
        tsr_dequant_row(t->dtype, (const uint8_t *)t->data + (uint64_t)r * rb, w + r * C, C);
    quant o;
    o.block[0] = style == STYLE_TENSOR ? R : style == STYLE_CHANNEL ? 1 : br;
    o.block[1] = style == STYLE_BLOCK ? bc : C;
    o.grid[0] = (R + o.block[0] - 1) / o.block[0];
    o.grid[1] = (C + o.block[1] - 1) / o.block[1];
    o.s = xmalloc((size_t)(o.grid[0] * o.grid[1]) * sizeof(float));
    for (int64_t gi = 0; gi < o.grid[0]; gi++)
        for (int64_t gj = 0; gj < o.grid[1]; gj++) {
            float amax = 0.0f;
            for (int64_t r = gi * o.block[0]; r < R && r < (gi + 1) * o.block[0]; r++)
                for (int64_t c = gj * o.block[1]; c < C && c < (gj + 1) * o.block[1]; c++)
                    amax = fmaxf(amax, fabsf(w[r * C + c]));
            o.s[gi * o.grid[1] + gj] = block_scale(amax, bf16);
        }
    o.q = xmalloc((size_t)(R * C));
    o.deq = xmalloc((size_t)(R * C) * sizeof(float));
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) {
            const float s = o.s[(r / o.block[0]) * o.grid[1] + c / o.block[1]];
            const uint8_t q = tsr_f32_to_f8e4m3(w[r * C + c] / s);
            o.q[r * C + c] = q;
            o.deq[r * C + c] = tsr_f8e4m3_to_f32(q) * s;
        }
    free(w);
    return o;
}

/* dir/name copied into to, when it exists. */
static void copy_file(const char *dir, const char *to, const char *name) {
    char *a = join(dir, name), *b = join(to, name);
    FILE *in = fopen(a, "rb");
    if (in) {
        FILE *o = fopen(b, "wb");
        if (!o) die("cannot write %s", b);
        char buf[65536];
        size_t k;
        while ((k = fread(buf, 1, sizeof buf, in)) > 0)
            if (fwrite(buf, 1, k, o) != k) die("cannot write %s", b);
        if (fclose(o) != 0) die("cannot write %s", b);
        fclose(in);
    }
    free(a), free(b);
}

static void write_config(const char *dir, json_t *cfg) {
    char *p = join(dir, "config.json");
    if (json_dump_file(cfg, p, JSON_INDENT(2)) != 0) die("cannot write %s", p);
    free(p);
}

static json_t *quant_config(style_t style, int64_t br, int64_t bc, int static_act, int lm_head) {
    if (style == STYLE_BLOCK)
        return json_pack("{s:s, s:s, s:s, s:[I, I]}", "quant_method", "fp8", "fmt", "e4m3",
                         "activation_scheme", static_act ? "static" : "dynamic", "weight_block_size",
                         (json_int_t)br, (json_int_t)bc);
    json_t *q = json_pack("{s:s, s:s, s:{s:{s:[s], s:{s:i, s:s, s:s, s:b, s:b}, s:{s:i, s:s, s:s, s:b, s:b}}}}",
                          "quant_method", "compressed-tensors", "format", "float-quantized", "config_groups",
                          "group_0", "targets", "Linear", "weights", "num_bits", 8, "type", "float", "strategy",
                          style == STYLE_TENSOR ? "tensor" : "channel", "dynamic", 0, "symmetric", 1,
                          "input_activations", "num_bits", 8, "type", "float", "strategy",
                          static_act ? "tensor" : "token", "dynamic", !static_act, "symmetric", 1);
    json_object_set_new(q, "ignore", lm_head ? json_array() : json_pack("[s]", "lm_head"));
    return q;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: mk_fp8_checkpoint SRC DST --style tensor|channel|block [--block R,C] "
                        "[--scale-dtype f32|bf16] [--static-input-scales] [--lm-head] [--dequant DIR]\n");
        return 2;
    }
    const char *src = argv[1], *dst = argv[2], *deq_dir = NULL;
    style_t style = STYLE_TENSOR;
    long long br = 128, bc = 128;
    int bf16 = 0, static_act = 0, have_style = 0, lm_head = 0;
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--style") && v) {
            style = !strcmp(v, "tensor") ? STYLE_TENSOR : !strcmp(v, "channel") ? STYLE_CHANNEL
                    : !strcmp(v, "block")                 ? STYLE_BLOCK
                                                          : (die("unknown style %s", v), STYLE_TENSOR);
            have_style = 1, i++;
        } else if (!strcmp(a, "--block") && v) {
            if (sscanf(v, "%lld,%lld", &br, &bc) != 2 || br < 1 || bc < 1) die("bad --block %s", v);
            i++;
        } else if (!strcmp(a, "--scale-dtype") && v) {
            if (strcmp(v, "f32") && strcmp(v, "bf16")) die("bad --scale-dtype %s", v);
            bf16 = !strcmp(v, "bf16"), i++;
        } else if (!strcmp(a, "--dequant") && v) {
            deq_dir = v, i++;
        } else if (!strcmp(a, "--lm-head")) {
            lm_head = 1;
        } else if (!strcmp(a, "--static-input-scales")) {
            static_act = 1;
        } else {
            die("unknown argument %s", a);
        }
    }
    if (!have_style) die("--style is required%s", "");
    if (style == STYLE_BLOCK && bf16) die("weight_scale_inv is f32 (DeepSeek-V3)%s", "");

    char *cfg_path = join(src, "config.json");
    json_error_t je;
    json_t *cfg = json_load_file(cfg_path, 0, &je);
    if (!cfg) die("cannot read %s", cfg_path);
    /* the shards: model.safetensors, or each file the index names */
    tsr_safetensors *shards[64];
    int n_shards = 0;
    tsr_error err;
    tsr_error_clear(&err);
    char *idx_path = join(src, "model.safetensors.index.json");
    json_t *idx = json_load_file(idx_path, 0, &je);
    const char *files[64];
    int n_files = 0;
    if (idx) {
        const char *key;
        json_t *v;
        json_object_foreach(json_object_get(idx, "weight_map"), key, v) {
            if (!json_string_value(v)) die("%s: a weight_map value is not a file name", idx_path);
            int k = 0;
            while (k < n_files && strcmp(files[k], json_string_value(v))) k++;
            if (k == n_files) {
                if (n_files == 64) die("%s: too many shards", idx_path);
                files[n_files++] = json_string_value(v);
            }
        }
    } else {
        files[n_files++] = "model.safetensors";
    }
    int n = 0;
    for (int k = 0; k < n_files; k++) {
        char *p = join(src, files[k]);
        if (tsr_safetensors_open(p, &shards[n_shards++], &err) != TSR_OK) die("%s", err.msg);
        n += tsr_safetensors_n_tensors(shards[n_shards - 1]);
        free(p);
    }
    mkdir(dst, 0755);
    if (deq_dir) mkdir(deq_dir, 0755);
    static const char *const extra[] = {"tokenizer.json", "tokenizer_config.json"};
    for (size_t k = 0; k < sizeof extra / sizeof extra[0]; k++) {
        copy_file(src, dst, extra[k]);
        if (deq_dir) copy_file(src, deq_dir, extra[k]);
    }

    tsr_tensor *out = xmalloc((size_t)(3 * n) * sizeof *out), *deq = xmalloc((size_t)n * sizeof *deq);
    char **names = xmalloc((size_t)(2 * n) * sizeof *names);
    void **owned = xmalloc((size_t)(4 * n) * sizeof *owned);
    int n_out = 0, n_names = 0, n_owned = 0;
    static const float one = 1.0f;
    for (int i = 0, sh = 0, at = 0; i < n; i++, at++) {
        while (at == tsr_safetensors_n_tensors(shards[sh])) sh++, at = 0;
        const tsr_tensor *t = tsr_safetensors_tensor_at(shards[sh], at);
        deq[i] = *t;
        if (!is_projection(t, lm_head)) {
            out[n_out++] = *t;
            continue;
        }
        const int64_t R = t->shape[0], C = t->shape[1];
        quant q = quantise(t, style, br, bc, bf16);
        owned[n_owned++] = q.q, owned[n_owned++] = q.s, owned[n_owned++] = q.deq;
        tsr_tensor w = *t;
        w.dtype = TSR_DTYPE_F8_E4M3;
        w.data = q.q;
        w.nbytes = (uint64_t)(R * C);
        out[n_out++] = w;
        /* the scale companion */
        size_t bl = strlen(t->name) - strlen(".weight");
        char *sn = xmalloc(bl + 32);
        snprintf(sn, bl + 32, "%.*s.%s", (int)bl, t->name, style == STYLE_BLOCK ? "weight_scale_inv" : "weight_scale");
        names[n_names++] = sn;
        tsr_tensor s = {0};
        s.name = sn;
        s.n_dims = style == STYLE_TENSOR ? 1 : 2;
        s.shape[0] = style == STYLE_TENSOR ? 1 : q.grid[0];
        s.shape[1] = q.grid[1];
        const int64_t ns = q.grid[0] * q.grid[1];
        if (bf16) {
            uint16_t *b = xmalloc((size_t)ns * 2);
            for (int64_t k = 0; k < ns; k++) b[k] = tsr_f32_to_bf16(q.s[k]); /* exact: s is a bf16 value */
            owned[n_owned++] = b;
            s.dtype = TSR_DTYPE_BF16, s.data = b, s.nbytes = (uint64_t)ns * 2;
        } else {
            s.dtype = TSR_DTYPE_F32, s.data = q.s, s.nbytes = (uint64_t)ns * 4;
        }
        out[n_out++] = s;
        if (static_act) {
            char *in = xmalloc(bl + 32);
            snprintf(in, bl + 32, "%.*s.input_scale", (int)bl, t->name);
            names[n_names++] = in;
            out[n_out++] = (tsr_tensor){.name = in, .dtype = TSR_DTYPE_F32, .n_dims = 1, .shape = {1},
                                        .data = &one, .nbytes = 4};
        }
        /* the dequantised f32 weight */
        deq[i].dtype = TSR_DTYPE_F32;
        deq[i].data = q.deq;
        deq[i].nbytes = (uint64_t)(R * C) * 4;
    }
    char *out_st = join(dst, "model.safetensors");
    if (tsr_safetensors_write(out_st, out, n_out, NULL, &err) != TSR_OK) die("%s", err.msg);
    if (deq_dir) {
        char *p = join(deq_dir, "model.safetensors");
        if (tsr_safetensors_write(p, deq, n, NULL, &err) != TSR_OK) die("%s", err.msg);
        free(p);
        write_config(deq_dir, cfg);
    }
    json_object_set_new(cfg, "quantization_config", quant_config(style, br, bc, static_act, lm_head));
    write_config(dst, cfg);

    free(out_st);
    for (int i = 0; i < n_owned; i++) free(owned[i]);
    for (int i = 0; i < n_names; i++) free(names[i]);
    free(owned), free(names), free(out), free(deq);
    for (int k = 0; k < n_shards; k++) tsr_safetensors_free(shards[k]);
    json_decref(cfg);
    json_decref(idx);
    free(cfg_path), free(idx_path);
    return 0;
}
