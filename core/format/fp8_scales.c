/*
 * fp8_scales.c - the scale companions of FP8 E4M3 checkpoints, checked and
 * attached to their weights (docs/FORMATS.md):
 *
 *   X.weight_scale      per tensor ([], [1], [1, 1]) or per output channel
 *                       ([rows, 1], [rows]): compressed-tensors, FBGEMM;
 *                       value = fp8 * scale
 *   X.weight_scale_inv  [ceil(rows / bn), ceil(cols / bk)] with [bn, bk] the
 *                       config's weight_block_size: DeepSeek-V3, Qwen3-FP8;
 *                       value = fp8 * scale_inv of its block
 *   X.input_scale       ignored only where quantization_config says the
 *                       activations are dynamic (or not quantised)
 *   X.input_scale_ub    FBGEMM's bound on dynamic activation scales: ignored
 *
 * Scales stored as f32, bf16 or f16 are widened to f32 (exactly) into one
 * buffer the model file owns. Every F8_E4M3 tensor must be a matrix with one
 * scale; in a checkpoint with FP8 weights or a quantization_config, any
 * tensor that is neither a weight, a bias nor one of the companions above is
 * refused, naming it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/dtype.h"
#include "../util/checked.h"
#include "format_internal.h"

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static void fmt_shape(char *buf, size_t n, const tsr_tensor *t) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < t->n_dims && o < n; d++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

/* The weight a companion named base + suffix scales, checked to be an
 * F8_E4M3 matrix without a scale yet. */
static int companion_of(tsr_tensor_table *tab, const tsr_tensor *s, const char *suffix,
                        const char *file, tsr_tensor **out, tsr_error *err) {
    char wname[256];
    size_t n = strlen(s->name) - strlen(suffix);
    if (n + sizeof ".weight" > sizeof wname)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0, "tensor \"%s\": name too long",
                                s->name);
    memcpy(wname, s->name, n);
    memcpy(wname + n, ".weight", sizeof ".weight");
    tsr_tensor *w = (tsr_tensor *)tsr_table_find(tab, wname);
    if (!w || w->dtype != TSR_DTYPE_F8_E4M3 || w->n_dims != 2)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                "tensor \"%s\" scales \"%s\", which is %s", s->name, wname,
                                !w ? "missing" : "not an F8_E4M3 matrix");
    if (w->scale_block[0] != 0)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                "tensor \"%s\": \"%s\" has both weight_scale and weight_scale_inv",
                                s->name, wname);
    *out = w;
    return TSR_OK;
}

/* Block of one scale of w as s's shape says (0 and an error when it fits
 * none of the layouts). */
static int scale_layout(const tsr_model_config *cfg, const tsr_tensor *s, const tsr_tensor *w,
                        int inv, const char *file, int64_t block[2], tsr_error *err) {
    const int64_t R = w->shape[0], C = w->shape[1];
    char have[80];
    fmt_shape(have, sizeof have, s);
    if (inv) {
        if (cfg->quant_block[0] < 1)
            return tsr_error_set_at(err, TSR_ERR_UNSUPPORTED, file, 0, 0,
                                    "tensor \"%s\": a weight_scale_inv needs "
                                    "quantization_config.weight_block_size (quant_method \"fp8\")",
                                    s->name);
        const int64_t bn = cfg->quant_block[0], bk = cfg->quant_block[1];
        if (s->n_dims != 2 || s->shape[0] != ceil_div(R, bn) || s->shape[1] != ceil_div(C, bk))
            return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                    "tensor \"%s\" has shape %s; blocks of %lld x %lld over [%lld, %lld] "
                                    "need [%lld, %lld]", s->name, have, (long long)bn, (long long)bk,
                                    (long long)R, (long long)C, (long long)ceil_div(R, bn),
                                    (long long)ceil_div(C, bk));
        block[0] = bn, block[1] = bk;
        return TSR_OK;
    }
    int tensor = (s->n_dims == 0) || (s->n_dims == 1 && s->shape[0] == 1) ||
                 (s->n_dims == 2 && s->shape[0] == 1 && s->shape[1] == 1);
    int row = (s->n_dims == 2 && s->shape[0] == R && s->shape[1] == 1) ||
              (s->n_dims == 1 && s->shape[0] == R);
    if (tensor && !(row && R == 1)) {
        block[0] = R, block[1] = C;
    } else if (row) {
        block[0] = 1, block[1] = C;
    } else {
        return tsr_error_set_at(err, TSR_ERR_UNSUPPORTED, file, 0, 0,
                                "tensor \"%s\" has shape %s: a weight_scale is per tensor ([] or [1]) "
                                "or per output channel ([%lld, 1]) of its [%lld, %lld] weight",
                                s->name, have, (long long)R, (long long)R, (long long)C);
    }
    return TSR_OK;
}

int tsr_fp8_scales_attach(tsr_tensor_table *tab, const tsr_model_config *cfg, const char *file,
                          float **owned, tsr_error *err) { /* *owned is set even on failure */
    *owned = NULL;
    int fp8 = cfg->quant_method[0] != '\0';
    for (int i = 0; i < tab->n && !fp8; i++) fp8 = tab->t[i].dtype == TSR_DTYPE_F8_E4M3;
    if (!fp8) return TSR_OK;
    /* pass 1: check every companion, count the scales; pass 2: widen them */
    uint64_t total = 0;
    float *buf = NULL;
    for (int pass = 0; pass < 2; pass++) {
        uint64_t at = 0;
        for (int i = 0; i < tab->n; i++) {
            const tsr_tensor *s = &tab->t[i];
            const char *name = s->name;
            int inv = ends_with(name, ".weight_scale_inv");
            if (!inv && !ends_with(name, ".weight_scale")) {
                if (pass) continue;
                if (ends_with(name, ".input_scale")) {
                    if (!cfg->quant_act_dynamic)
                        return tsr_error_set_at(err, TSR_ERR_UNSUPPORTED, file, 0, 0,
                                                "tensor \"%s\": static activation scales are not "
                                                "applied (tessera keeps activations in f32/bf16), "
                                                "and quantization_config does not say the "
                                                "activations are dynamic", name);
                    continue;
                }
                if (ends_with(name, ".input_scale_ub") && strcmp(cfg->quant_method, "fbgemm_fp8") == 0)
                    continue;
                if (!ends_with(name, ".weight") && !ends_with(name, ".bias"))
                    return tsr_error_set_at(err, TSR_ERR_UNSUPPORTED, file, 0, 0,
                                            "tensor \"%s\" is not understood in an FP8 checkpoint "
                                            "(weights, biases, weight_scale, weight_scale_inv and "
                                            "dynamic input_scale are)", name);
                continue;
            }
            tsr_tensor *w = NULL;
            if (pass == 0) {
                int rc = companion_of(tab, s, inv ? ".weight_scale_inv" : ".weight_scale", file, &w, err);
                if (rc) return rc;
                if (s->dtype != TSR_DTYPE_F32 && s->dtype != TSR_DTYPE_BF16 && s->dtype != TSR_DTYPE_F16)
                    return tsr_error_set_at(err, TSR_ERR_UNSUPPORTED, file, 0, 0,
                                            "tensor \"%s\" is %s: scales are read as f32, bf16 or f16",
                                            name, tsr_dtype_name(s->dtype));
                int64_t block[2] = {0, 0};
                if ((rc = scale_layout(cfg, s, w, inv, file, block, err))) return rc;
                w->scale_block[0] = block[0], w->scale_block[1] = block[1];
                uint64_t n;
                if (tsr_dims_product(s->shape, s->n_dims, &n) || tsr_add_u64(total, n, &total))
                    return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0, "tensor \"%s\": size", name);
                continue;
            }
            /* pass 2: the weight is the one pass 1 found */
            char wname[256];
            size_t n = strlen(name) - strlen(inv ? ".weight_scale_inv" : ".weight_scale");
            memcpy(wname, name, n);
            memcpy(wname + n, ".weight", sizeof ".weight");
            w = (tsr_tensor *)tsr_table_find(tab, wname);
            uint64_t cnt = 0;
            tsr_dims_product(s->shape, s->n_dims, &cnt);
            float *dst = buf + at;
            tsr_dequant_row(s->dtype, s->data, dst, (int64_t)cnt);
            for (uint64_t k = 0; k < cnt; k++)
                if (!isfinite(dst[k]) || dst[k] < 0.0f) {
                    *owned = buf; /* the caller frees it with the file */
                    return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                            "tensor \"%s\": scale %llu is %g (scales are finite "
                                            "and >= 0)", name, (unsigned long long)k, (double)dst[k]);
                }
            w->scale = dst;
            at += cnt;
        }
        if (pass == 0) {
            for (int i = 0; i < tab->n; i++) {
                const tsr_tensor *t = &tab->t[i];
                if (t->dtype == TSR_DTYPE_F8_E4M3 && t->scale_block[0] == 0)
                    return tsr_error_set_at(err, TSR_ERR_UNSUPPORTED, file, 0, 0,
                                            "tensor \"%s\" is F8_E4M3 without a weight_scale or "
                                            "weight_scale_inv companion (its values would be "
                                            "unscaled)", t->name);
            }
            if (total == 0) return TSR_OK;
            if (total > ((uint64_t)1 << 40) || !(buf = malloc((size_t)total * sizeof(float))))
                return tsr_error_set_at(err, TSR_ERR_NOMEM, file, 0, 0, "out of memory for %llu scales",
                                        (unsigned long long)total);
        }
    }
    *owned = buf;
    return TSR_OK;
}
