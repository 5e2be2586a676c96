#include "model_config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../../kernels/dtype.h"
#include "format_internal.h"

static const char *const arch_names[] = {"llama", "qwen2", "qwen3", "mixtral", "qwen2_moe",
                                         "qwen3_moe"};

int tsr_arch_from_name(const char *name) {
    for (int i = 0; i < 6; i++)
        if (name && strcmp(arch_names[i], name) == 0) return i;
    return -1;
}

const char *tsr_arch_name(tsr_arch arch) {
    return (unsigned)arch < 6 ? arch_names[arch] : "unknown";
}

static int is_moe_arch(tsr_arch a) {
    return a == TSR_ARCH_MIXTRAL || a == TSR_ARCH_QWEN2_MOE || a == TSR_ARCH_QWEN3_MOE;
}

/* --- config.json ----------------------------------------------------------------------- */

typedef struct jctx {
    const json_t *root;
    const char *file;
    tsr_error *err;
} jctx;

static int missing(jctx *c, const char *key) {
    return tsr_error_set_at(c->err, TSR_ERR_FORMAT, c->file, 0, 0, "missing field \"%s\"", key);
}

/* Integer field in [lo, hi]. Absent or null: *out = def, or an error when
 * required. */
static int j_int(jctx *c, const json_t *obj, const char *key, int required, long long def,
                 long long lo, long long hi, int *out) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required) return missing(c, key);
        *out = (int)def;
        return TSR_OK;
    }
    long long x;
    if (json_is_integer(v))
        x = json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
             fabs(json_real_value(v)) < 9e15)
        x = (long long)json_real_value(v);
    else
        return tsr_error_set_at(c->err, TSR_ERR_FORMAT, c->file, 0, 0,
                                "field \"%s\" must be an integer", key);
    if (x < lo || x > hi)
        return tsr_error_set_at(c->err, TSR_ERR_FORMAT, c->file, 0, 0,
                                "field \"%s\" = %lld is outside %lld..%lld", key, x, lo, hi);
    *out = (int)x;
    return TSR_OK;
}

static int j_num(jctx *c, const json_t *obj, const char *key, int required, double def,
                 float *out) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required) return missing(c, key);
        *out = (float)def;
        return TSR_OK;
    }
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return tsr_error_set_at(c->err, TSR_ERR_FORMAT, c->file, 0, 0,
                                "field \"%s\" must be a finite number", key);
    *out = (float)json_number_value(v);
    return TSR_OK;
}

static int j_bool(jctx *c, const json_t *obj, const char *key, int def, int *out) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return TSR_OK;
    }
    if (!json_is_boolean(v))
        return tsr_error_set_at(c->err, TSR_ERR_FORMAT, c->file, 0, 0,
                                "field \"%s\" must be true or false", key);
    *out = json_is_true(v);
    return TSR_OK;
}

#define CK(x)                                                                              \
    do {                                                                                   \
        int rc_ = (x);                                                                     \
        if (rc_) return rc_;                                                               \
    } while (0)

/* rope_parameters (transformers 5) or rope_theta + rope_scaling (4). */
static int read_rope(jctx *c, tsr_model_config *cfg, double theta_def) {
    const json_t *rp = json_object_get(c->root, "rope_parameters");
    const json_t *rs = json_object_get(c->root, "rope_scaling");
    const char *field = "rope_parameters";
    if (rp && !json_is_null(rp)) {
        if (!json_is_object(rp))
            return tsr_error_set_at(c->err, TSR_ERR_FORMAT, c->file, 0, 0,
                                    "field \"rope_parameters\" must be an object");
        CK(j_num(c, rp, "rope_theta", 0, theta_def, &cfg->rope_theta));
    } else {
        CK(j_num(c, c->root, "rope_theta", 0, theta_def, &cfg->rope_theta));
        rp = rs;
        field = "rope_scaling";
    }
    cfg->rope_scaling = TSR_ROPE_NONE;
    cfg->rope_factor = 1.0f;
    if (!rp || json_is_null(rp)) return TSR_OK;
    if (!json_is_object(rp))
        return tsr_error_set_at(c->err, TSR_ERR_FORMAT, c->file, 0, 0,
                                "field \"%s\" must be an object", field);
    const json_t *jt = json_object_get(rp, "rope_type");
    if (!jt) jt = json_object_get(rp, "type");
    const char *type = json_is_string(jt) ? json_string_value(jt) : NULL;
    if (!type)
        return tsr_error_set_at(c->err, TSR_ERR_FORMAT, c->file, 0, 0,
                                "field \"%s.rope_type\" is missing or not a string", field);
    if (strcmp(type, "default") == 0) return TSR_OK;
    if (strcmp(type, "linear") == 0) {
        cfg->rope_scaling = TSR_ROPE_LINEAR;
        CK(j_num(c, rp, "factor", 1, 1.0, &cfg->rope_factor));
    } else if (strcmp(type, "llama3") == 0) {
        cfg->rope_scaling = TSR_ROPE_LLAMA3;
        CK(j_num(c, rp, "factor", 1, 1.0, &cfg->rope_factor));
        CK(j_num(c, rp, "low_freq_factor", 1, 1.0, &cfg->rope_low_freq_factor));
        CK(j_num(c, rp, "high_freq_factor", 1, 4.0, &cfg->rope_high_freq_factor));
        CK(j_int(c, rp, "original_max_position_embeddings", 1, 0, 1, 1 << 30,
                 &cfg->rope_orig_ctx));
        if (!(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor))
            return tsr_error_set_at(c->err, TSR_ERR_FORMAT, c->file, 0, 0,
                                    "field \"%s\": high_freq_factor must exceed "
                                    "low_freq_factor", field);
    } else {
        return tsr_error_set_at(c->err, TSR_ERR_UNSUPPORTED, c->file, 0, 0,
                                "field \"%s.rope_type\" = \"%s\" is not supported (default, "
                                "linear, llama3)", field, type);
    }
    if (!(cfg->rope_factor > 0))
        return tsr_error_set_at(c->err, TSR_ERR_FORMAT, c->file, 0, 0,
                                "field \"%s.factor\" must be > 0", field);
    return TSR_OK;
}

static int read_tokens(jctx *c, tsr_model_config *cfg, int bos_def, int eos_def) {
    CK(j_int(c, c->root, "bos_token_id", 0, bos_def, -1, INT32_MAX, &cfg->bos));
    const json_t *e = json_object_get(c->root, "eos_token_id");
    cfg->n_eos = 0;
    if (!e) {
        if (eos_def >= 0) cfg->eos[cfg->n_eos++] = eos_def;
    } else if (json_is_array(e)) {
        size_t i;
        const json_t *v;
        json_array_foreach(e, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) > INT32_MAX)
                return tsr_error_set_at(c->err, TSR_ERR_FORMAT, c->file, 0, 0,
                                        "field \"eos_token_id\"[%zu] must be an integer >= 0", i);
            if (cfg->n_eos == TSR_MAX_EOS)
                return tsr_error_set_at(c->err, TSR_ERR_UNSUPPORTED, c->file, 0, 0,
                                        "field \"eos_token_id\" lists more than %d ids",
                                        TSR_MAX_EOS);
            cfg->eos[cfg->n_eos++] = (int)json_integer_value(v);
        }
    } else if (!json_is_null(e)) {
        int id;
        CK(j_int(c, c->root, "eos_token_id", 1, 0, 0, INT32_MAX, &id));
        cfg->eos[cfg->n_eos++] = id;
    }
    return TSR_OK;
}

static int quant_refuse(jctx *c, const char *what) {
    return tsr_error_set_at(c->err, TSR_ERR_UNSUPPORTED, c->file, 0, 0,
                            "field \"quantization_config\": %s (FP8 E4M3 weights are read: "
                            "quant_method \"fp8\", \"fbgemm_fp8\", or \"compressed-tensors\" "
                            "with 8-bit float weights per tensor or per channel)", what);
}

/* compressed-tensors: every config group quantises weights to 8-bit floats
 * per tensor or per channel; activations dynamic or not quantised. */
static int read_compressed_tensors(jctx *c, const json_t *q, tsr_model_config *cfg) {
    const json_t *fmt = json_object_get(q, "format");
    if (fmt && !json_is_null(fmt) &&
        (!json_is_string(fmt) || strcmp(json_string_value(fmt), "float-quantized") != 0))
        return quant_refuse(c, "compressed-tensors \"format\" is not \"float-quantized\"");
    const json_t *groups = json_object_get(q, "config_groups");
    if (!json_is_object(groups) || json_object_size(groups) == 0)
        return quant_refuse(c, "compressed-tensors without \"config_groups\"");
    cfg->quant_act_dynamic = 1;
    const char *key;
    const json_t *g;
    json_object_foreach((json_t *)groups, key, g) {
        const json_t *w = json_object_get(g, "weights");
        const json_t *bits = json_object_get(w, "num_bits"), *type = json_object_get(w, "type"),
                     *strat = json_object_get(w, "strategy");
        if (!json_is_object(w) || json_integer_value(bits) != 8 || !json_is_string(type) ||
            strcmp(json_string_value(type), "float") != 0 || !json_is_string(strat) ||
            (strcmp(json_string_value(strat), "tensor") != 0 &&
             strcmp(json_string_value(strat), "channel") != 0))
            return quant_refuse(c, "a config group's \"weights\" are not 8-bit floats per tensor "
                                   "or per channel");
        const json_t *a = json_object_get(g, "input_activations");
        if (a && !json_is_null(a) && !json_is_true(json_object_get(a, "dynamic")))
            cfg->quant_act_dynamic = 0; /* static input scales: refused where they are stored */
    }
    return TSR_OK;
}

/* quantization_config: what the loader needs to read FP8 E4M3 checkpoints
 * (the scale tensors are checked against it in fp8_scales.c). Any other
 * quantisation method is refused here, by name. */
static int read_quant(jctx *c, tsr_model_config *cfg) {
    const json_t *q = json_object_get(c->root, "quantization_config");
    if (!q || json_is_null(q)) return TSR_OK;
    const json_t *m = json_object_get(q, "quant_method");
    if (!json_is_object(q) || !json_is_string(m))
        return quant_refuse(c, "no \"quant_method\" string");
    const char *method = json_string_value(m);
    if (strcmp(method, "fp8") == 0) {
        const json_t *fmt = json_object_get(q, "fmt"), *act = json_object_get(q, "activation_scheme");
        if (fmt && !json_is_null(fmt) &&
            (!json_is_string(fmt) || strcmp(json_string_value(fmt), "e4m3") != 0))
            return quant_refuse(c, "\"fmt\" is not \"e4m3\"");
        cfg->quant_act_dynamic = json_is_string(act) && strcmp(json_string_value(act), "dynamic") == 0;
        const json_t *bs = json_object_get(q, "weight_block_size");
        if (bs && !json_is_null(bs)) {
            if (!json_is_array(bs) || json_array_size(bs) != 2 ||
                json_integer_value(json_array_get(bs, 0)) < 1 ||
                json_integer_value(json_array_get(bs, 1)) < 1 ||
                json_integer_value(json_array_get(bs, 0)) > (1 << 20) ||
                json_integer_value(json_array_get(bs, 1)) > (1 << 20))
                return quant_refuse(c, "\"weight_block_size\" is not two integers in 1..2^20");
            cfg->quant_block[0] = (int)json_integer_value(json_array_get(bs, 0));
            cfg->quant_block[1] = (int)json_integer_value(json_array_get(bs, 1));
        }
    } else if (strcmp(method, "fbgemm_fp8") == 0) {
        cfg->quant_act_dynamic = 1; /* per-token scales computed at run time (input_scale_ub bounds them) */
    } else if (strcmp(method, "compressed-tensors") == 0) {
        CK(read_compressed_tensors(c, q, cfg));
    } else {
        char what[96];
        snprintf(what, sizeof what, "quant_method \"%.40s\" is not supported", method);
        return quant_refuse(c, what);
    }
    snprintf(cfg->quant_method, sizeof cfg->quant_method, "%s", method);
    return TSR_OK;
}

int tsr_config_from_json(const json_t *root, const char *file, tsr_model_config *cfg,
                         tsr_error *err) {
    jctx c = {root, file, err};
    memset(cfg, 0, sizeof *cfg);
    cfg->dtype = TSR_DTYPE_COUNT;
    if (!json_is_object(root))
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0, "not a JSON object");
    const json_t *mt = json_object_get(root, "model_type");
    if (!mt) return missing(&c, "model_type");
    if (!json_is_string(mt))
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                "field \"model_type\" must be a string");
    int arch = tsr_arch_from_name(json_string_value(mt));
    if (arch < 0)
        return tsr_error_set_at(err, TSR_ERR_UNSUPPORTED, file, 0, 0,
                                "field \"model_type\" = \"%s\" is not supported (llama, qwen2, "
                                "qwen3, mixtral, qwen2_moe, qwen3_moe)", json_string_value(mt));
    cfg->arch = (tsr_arch)arch;
    snprintf(cfg->arch_name, sizeof cfg->arch_name, "%s", arch_names[arch]);
    int moe = is_moe_arch(cfg->arch);
    int qwen = cfg->arch != TSR_ARCH_LLAMA && cfg->arch != TSR_ARCH_MIXTRAL;

    CK(j_int(&c, root, "vocab_size", 1, 0, 1, INT32_MAX, &cfg->vocab));
    CK(j_int(&c, root, "hidden_size", 1, 0, 1, 1 << 20, &cfg->hidden));
    CK(j_int(&c, root, "num_hidden_layers", 1, 0, 1, TSR_MAX_LAYERS, &cfg->n_layers));
    CK(j_int(&c, root, "num_attention_heads", 1, 0, 1, 1 << 16, &cfg->n_heads));
    CK(j_int(&c, root, "num_key_value_heads", 0, cfg->n_heads, 1, cfg->n_heads,
             &cfg->n_kv_heads));
    if (cfg->n_heads % cfg->n_kv_heads != 0)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                "field \"num_key_value_heads\" = %d does not divide "
                                "num_attention_heads = %d", cfg->n_kv_heads, cfg->n_heads);
    CK(j_int(&c, root, "head_dim", 0, 0, 1, 1 << 16, &cfg->head_dim));
    if (cfg->head_dim == 0) {
        if (cfg->hidden % cfg->n_heads != 0)
            return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                    "field \"head_dim\" is absent and hidden_size %d is not a "
                                    "multiple of num_attention_heads %d", cfg->hidden,
                                    cfg->n_heads);
        cfg->head_dim = cfg->hidden / cfg->n_heads;
    }
    if (cfg->head_dim % 2 != 0)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                "field \"head_dim\" = %d must be even for RoPE", cfg->head_dim);

    int max_ctx_def = cfg->arch == TSR_ARCH_LLAMA ? 2048
                      : cfg->arch == TSR_ARCH_MIXTRAL ? 4096 * 32
                                                      : 32768;
    CK(j_int(&c, root, "max_position_embeddings", 0, max_ctx_def, 1, INT32_MAX, &cfg->max_ctx));
    CK(j_num(&c, root, "rms_norm_eps", 0, cfg->arch == TSR_ARCH_MIXTRAL ? 1e-5 : 1e-6,
             &cfg->norm_eps));
    if (!(cfg->norm_eps > 0))
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                "field \"rms_norm_eps\" must be > 0");
    CK(read_rope(&c, cfg, cfg->arch == TSR_ARCH_MIXTRAL ? 1e6 : 10000.0));
    if (!(cfg->rope_theta > 0))
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0, "field \"rope_theta\" must be > 0");
    cfg->rope_interleaved = 0; /* HF checkpoints store q/k for half-split RoPE */
    CK(j_bool(&c, root, "tie_word_embeddings", 0, &cfg->tie_embeddings));

    int bias = 0;
    CK(j_bool(&c, root, "attention_bias", 0, &bias));
    if (cfg->arch == TSR_ARCH_QWEN2 || cfg->arch == TSR_ARCH_QWEN2_MOE) {
        cfg->attn_bias = 1; /* q/k/v always have biases; o_proj never */
        cfg->attn_out_bias = 0;
    } else if (cfg->arch != TSR_ARCH_MIXTRAL) {
        cfg->attn_bias = cfg->attn_out_bias = bias;
    }
    cfg->qk_norm = cfg->arch == TSR_ARCH_QWEN3 || cfg->arch == TSR_ARCH_QWEN3_MOE;

    int use_sw = 0;
    CK(j_bool(&c, root, "use_sliding_window", 0, &use_sw));
    if (use_sw || cfg->arch == TSR_ARCH_MIXTRAL)
        CK(j_int(&c, root, "sliding_window", 0, 0, 0, INT32_MAX, &cfg->sliding_window));

    /* experts */
    if (moe) {
        const char *ne_key = json_object_get(root, "num_local_experts") ? "num_local_experts"
                             : json_object_get(root, "num_experts")    ? "num_experts"
                             : cfg->arch == TSR_ARCH_MIXTRAL           ? "num_local_experts"
                                                                       : "num_experts";
        CK(j_int(&c, root, ne_key, 1, 0, 1, 1 << 16, &cfg->n_experts));
        CK(j_int(&c, root, "num_experts_per_tok", 1, 0, 1, cfg->n_experts,
                 &cfg->n_experts_used));
    }
    int sparse_step = 1;
    if (cfg->arch == TSR_ARCH_QWEN2_MOE || cfg->arch == TSR_ARCH_QWEN3_MOE) {
        CK(j_int(&c, root, "moe_intermediate_size", 1, 0, 1, 1 << 24, &cfg->expert_ffn));
        CK(j_bool(&c, root, "norm_topk_prob", 0, &cfg->norm_topk_prob));
        CK(j_int(&c, root, "decoder_sparse_step", 0, 1, 1, TSR_MAX_LAYERS, &sparse_step));
        if (cfg->arch == TSR_ARCH_QWEN2_MOE)
            CK(j_int(&c, root, "shared_expert_intermediate_size", 1, 0, 0, 1 << 24,
                     &cfg->shared_expert_ffn));
        for (int i = 0; i < cfg->n_layers; i++)
            cfg->layer_moe[i] = cfg->n_experts > 0 && (i + 1) % sparse_step == 0;
        const json_t *mlp_only = json_object_get(root, "mlp_only_layers");
        if (mlp_only && !json_is_null(mlp_only)) {
            if (!json_is_array(mlp_only))
                return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                        "field \"mlp_only_layers\" must be an array");
            size_t i;
            const json_t *v;
            json_array_foreach(mlp_only, i, v) {
                if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                    json_integer_value(v) >= cfg->n_layers)
                    return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                            "field \"mlp_only_layers\"[%zu] is not a layer "
                                            "index in 0..%d", i, cfg->n_layers - 1);
                cfg->layer_moe[json_integer_value(v)] = 0;
            }
        }
    } else if (cfg->arch == TSR_ARCH_MIXTRAL) {
        CK(j_int(&c, root, "intermediate_size", 1, 0, 1, 1 << 24, &cfg->expert_ffn));
        cfg->norm_topk_prob = 1;
        for (int i = 0; i < cfg->n_layers; i++) cfg->layer_moe[i] = 1;
    }
    int any_dense = 0;
    for (int i = 0; i < cfg->n_layers; i++) any_dense |= !cfg->layer_moe[i];
    if (cfg->arch == TSR_ARCH_MIXTRAL)
        cfg->ffn = 0;
    else
        CK(j_int(&c, root, "intermediate_size", any_dense, 0, 0, 1 << 24, &cfg->ffn));
    if (any_dense && cfg->ffn == 0)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                "field \"intermediate_size\" must be > 0 (dense layers exist)");
    if (!any_dense) cfg->ffn = 0; /* no dense MLP: tsr_model_desc.ffn is 0 */

    CK(read_tokens(&c, cfg, qwen ? -1 : 1, qwen ? -1 : 2));
    CK(read_quant(&c, cfg));
    return TSR_OK;
}

int tsr_model_config_load(const char *path, tsr_model_config *cfg, tsr_error *err) {
    if (access(path, R_OK) != 0)
        return tsr_error_set_at(err, TSR_ERR_IO, path, 0, 0, "cannot open: %s", strerror(errno));
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, path, je.line > 0 ? je.line : 0,
                                je.column > 0 ? je.column : 0, "%s", je.text);
    int rc = tsr_config_from_json(root, path, cfg, err);
    json_decref(root);
    return rc;
}

/* --- GGUF metadata ---------------------------------------------------------------------- */

typedef struct gctx {
    const tsr_gguf *g;
    const char *file;
    const char *arch; /* key prefix as stored */
    tsr_error *err;
} gctx;

/* key = "<arch>.<suffix>" and its index in the metadata (-1 when absent,
 * an error when required). */
static int g_key(gctx *c, const char *suffix, int required, char key[128], int *idx) {
    snprintf(key, 128, "%s.%s", c->arch, suffix);
    *idx = tsr_gguf_find(c->g, key);
    if (*idx < 0 && required)
        return tsr_error_set_at(c->err, TSR_ERR_FORMAT, c->file, 0, 0, "missing metadata key \"%s\"", key);
    return TSR_OK;
}

static int g_int(gctx *c, const char *suffix, int required, long long def, long long lo,
                 long long hi, int *out) {
    char key[128];
    int idx, rc = g_key(c, suffix, required, key, &idx);
    if (rc != TSR_OK) return rc;
    if (idx < 0) {
        *out = (int)def;
        return TSR_OK;
    }
    int64_t v;
    if (tsr_gguf_get_int(c->g, idx, &v) || v < lo || v > hi)
        return tsr_error_set_at(c->err, TSR_ERR_FORMAT, c->file, 0, 0,
                                "metadata key \"%s\" must be an integer in %lld..%lld", key, lo,
                                hi);
    *out = (int)v;
    return TSR_OK;
}

static int g_num(gctx *c, const char *suffix, int required, double def, float *out) {
    char key[128];
    int idx, rc = g_key(c, suffix, required, key, &idx);
    if (rc != TSR_OK) return rc;
    if (idx < 0) {
        *out = (float)def;
        return TSR_OK;
    }
    double v;
    if (tsr_gguf_get_float(c->g, idx, &v) || !isfinite(v) || !(v > 0))
        return tsr_error_set_at(c->err, TSR_ERR_FORMAT, c->file, 0, 0,
                                "metadata key \"%s\" must be a number > 0", key);
    *out = (float)v;
    return TSR_OK;
}

static int has_tensor(const tsr_gguf *g, const char *fmt, int layer) {
    char name[96];
    snprintf(name, sizeof name, fmt, layer);
    return tsr_gguf_find_tensor(g, name) >= 0;
}

int tsr_config_from_gguf(const tsr_gguf *g, const char *file, tsr_model_config *cfg,
                         tsr_error *err) {
    memset(cfg, 0, sizeof *cfg);
    cfg->dtype = TSR_DTYPE_COUNT;
    uint64_t alen = 0;
    const char *a = tsr_gguf_get_str(g, tsr_gguf_find(g, "general.architecture"), &alen);
    if (!a)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                "missing metadata key \"general.architecture\"");
    char arch[32];
    if (alen >= sizeof arch || memchr(a, 0, (size_t)alen))
        return tsr_error_set_at(err, TSR_ERR_UNSUPPORTED, file, 0, 0,
                                "general.architecture is not supported");
    memcpy(arch, a, (size_t)alen);
    arch[alen] = '\0';
    gctx c = {g, file, arch, err};
    int n_exp = 0;
    CK(g_int(&c, "expert_count", 0, 0, 0, 1 << 16, &n_exp));
    if (strcmp(arch, "llama") == 0)
        cfg->arch = n_exp > 0 ? TSR_ARCH_MIXTRAL : TSR_ARCH_LLAMA;
    else if (strcmp(arch, "qwen2") == 0)
        cfg->arch = TSR_ARCH_QWEN2;
    else if (strcmp(arch, "qwen3") == 0)
        cfg->arch = TSR_ARCH_QWEN3;
    else if (strcmp(arch, "qwen2moe") == 0)
        cfg->arch = TSR_ARCH_QWEN2_MOE;
    else if (strcmp(arch, "qwen3moe") == 0)
        cfg->arch = TSR_ARCH_QWEN3_MOE;
    else
        return tsr_error_set_at(err, TSR_ERR_UNSUPPORTED, file, 0, 0,
                                "general.architecture \"%s\" is not supported (llama, qwen2, "
                                "qwen3, qwen2moe, qwen3moe)", arch);
    snprintf(cfg->arch_name, sizeof cfg->arch_name, "%s", arch_names[cfg->arch]);
    int moe = is_moe_arch(cfg->arch);

    CK(g_int(&c, "embedding_length", 1, 0, 1, 1 << 20, &cfg->hidden));
    CK(g_int(&c, "block_count", 1, 0, 1, TSR_MAX_LAYERS, &cfg->n_layers));
    CK(g_int(&c, "attention.head_count", 1, 0, 1, 1 << 16, &cfg->n_heads));
    CK(g_int(&c, "attention.head_count_kv", 0, cfg->n_heads, 1, cfg->n_heads, &cfg->n_kv_heads));
    if (cfg->n_heads % cfg->n_kv_heads != 0)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                "%s.attention.head_count_kv does not divide head_count", arch);
    CK(g_int(&c, "attention.key_length", 0, 0, 1, 1 << 16, &cfg->head_dim));
    if (cfg->head_dim == 0) {
        if (cfg->hidden % cfg->n_heads != 0)
            return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                    "missing metadata key \"%s.attention.key_length\" and "
                                    "embedding_length is not a multiple of head_count", arch);
        cfg->head_dim = cfg->hidden / cfg->n_heads;
    }
    if (cfg->head_dim % 2)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0, "head dim %d is odd",
                                cfg->head_dim);
    CK(g_int(&c, "context_length", 1, 0, 1, INT32_MAX, &cfg->max_ctx));
    CK(g_num(&c, "attention.layer_norm_rms_epsilon", 1, 0, &cfg->norm_eps));
    CK(g_num(&c, "rope.freq_base", 0, 10000.0, &cfg->rope_theta));
    cfg->rope_factor = 1.0f;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    uint64_t stl = 0;
    const char *st = tsr_gguf_get_str(g, tsr_gguf_find(g, key), &stl);
    if (st && !(stl == 4 && memcmp(st, "none", 4) == 0)) {
        if (stl == 6 && memcmp(st, "linear", 6) == 0) {
            cfg->rope_scaling = TSR_ROPE_LINEAR;
            CK(g_num(&c, "rope.scaling.factor", 1, 1.0, &cfg->rope_factor));
        } else {
            return tsr_error_set_at(err, TSR_ERR_UNSUPPORTED, file, 0, 0,
                                    "metadata key \"%s\" = \"%.*s\" is not supported", key,
                                    (int)(stl > 32 ? 32 : stl), st);
        }
    }
    if (tsr_gguf_find_tensor(g, "rope_freqs.weight") >= 0)
        return tsr_error_set_at(err, TSR_ERR_UNSUPPORTED, file, 0, 0,
                                "tensor \"rope_freqs.weight\" (per-frequency RoPE factors) is not "
                                "supported");
    /* llama.cpp's converter permutes llama's q/k rows for interleaved RoPE */
    cfg->rope_interleaved = cfg->arch == TSR_ARCH_LLAMA || cfg->arch == TSR_ARCH_MIXTRAL;

    /* vocabulary: the embedding's rows (it may be padded past the token list) */
    uint64_t nv = 0;
    tsr_gguf_type et;
    int ei = tsr_gguf_find_tensor(g, "token_embd.weight");
    if (ei >= 0 && tsr_gguf_tensor(g, ei)->n_dims == 2)
        cfg->vocab = tsr_gguf_tensor(g, ei)->ne[1] > INT32_MAX ? -1
                                                                : (int)tsr_gguf_tensor(g, ei)->ne[1];
    else if (tsr_gguf_get_arr(g, tsr_gguf_find(g, "tokenizer.ggml.tokens"), &et, &nv, NULL) == 0)
        cfg->vocab = nv > INT32_MAX ? -1 : (int)nv;
    if (cfg->vocab <= 0)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                "no vocabulary size: neither tokenizer.ggml.tokens nor "
                                "token_embd.weight");
    cfg->tie_embeddings = tsr_gguf_find_tensor(g, "output.weight") < 0;
    cfg->qk_norm = cfg->arch == TSR_ARCH_QWEN3 || cfg->arch == TSR_ARCH_QWEN3_MOE;
    cfg->attn_bias = has_tensor(g, "blk.%d.attn_q.bias", 0);
    cfg->attn_out_bias = has_tensor(g, "blk.%d.attn_output.bias", 0);
    if (cfg->arch == TSR_ARCH_QWEN2 || cfg->arch == TSR_ARCH_QWEN2_MOE) cfg->attn_bias = 1;

    if (moe) {
        if (n_exp <= 0)
            return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                    "missing or zero metadata key \"%s.expert_count\"", arch);
        cfg->n_experts = n_exp;
        CK(g_int(&c, "expert_used_count", 1, 0, 1, n_exp > 0 ? n_exp : 1, &cfg->n_experts_used));
        if (cfg->arch == TSR_ARCH_MIXTRAL) {
            CK(g_int(&c, "feed_forward_length", 1, 0, 1, 1 << 24, &cfg->expert_ffn));
            cfg->norm_topk_prob = 1;
        } else {
            CK(g_int(&c, "expert_feed_forward_length", 1, 0, 1, 1 << 24, &cfg->expert_ffn));
            cfg->norm_topk_prob = cfg->arch == TSR_ARCH_QWEN3_MOE;
        }
        if (cfg->arch == TSR_ARCH_QWEN2_MOE)
            CK(g_int(&c, "expert_shared_feed_forward_length", 0, 0, 0, 1 << 24,
                     &cfg->shared_expert_ffn));
        snprintf(key, sizeof key, "%s.expert_weights_norm", arch);
        int b;
        if (tsr_gguf_get_bool(g, tsr_gguf_find(g, key), &b) == 0) cfg->norm_topk_prob = b;
        for (int i = 0; i < cfg->n_layers; i++)
            cfg->layer_moe[i] = has_tensor(g, "blk.%d.ffn_gate_inp.weight", i);
    }
    int any_dense = 0;
    for (int i = 0; i < cfg->n_layers; i++) any_dense |= !cfg->layer_moe[i];
    if (cfg->arch != TSR_ARCH_MIXTRAL)
        CK(g_int(&c, "feed_forward_length", any_dense, 0, 0, 1 << 24, &cfg->ffn));
    if (!any_dense) cfg->ffn = 0;

    int64_t v;
    cfg->bos = -1;
    if (tsr_gguf_get_int(g, tsr_gguf_find(g, "tokenizer.ggml.bos_token_id"), &v) == 0 &&
        v >= 0 && v <= INT32_MAX)
        cfg->bos = (int)v;
    if (tsr_gguf_get_int(g, tsr_gguf_find(g, "tokenizer.ggml.eos_token_id"), &v) == 0 &&
        v >= 0 && v <= INT32_MAX)
        cfg->eos[cfg->n_eos++] = (int)v;
    return TSR_OK;
}

/* --- the config against the tensors ------------------------------------------------------- */

static void fmt_shape(char *buf, size_t n, int nd, const int64_t *s) {
    size_t p = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < nd && p < n; i++)
        p += (size_t)snprintf(buf + p, n - p, "%s%lld", i ? ", " : "", (long long)s[i]);
    if (p < n) snprintf(buf + p, n - p, "]");
}

static int expect(const tsr_tensor_table *tab, const char *file, tsr_error *err, int required,
                  int nd, int64_t d0, int64_t d1, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));

static int expect(const tsr_tensor_table *tab, const char *file, tsr_error *err, int required,
                  int nd, int64_t d0, int64_t d1, const char *fmt, ...) {
    char name[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const tsr_tensor *t = tsr_table_find(tab, name);
    int64_t want[2] = {d0, d1};
    char ws[64], hs[96];
    fmt_shape(ws, sizeof ws, nd, want);
    if (!t) {
        if (!required) return TSR_OK;
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                "tensor \"%s\" is missing (the config implies shape %s)", name,
                                ws);
    }
    if (t->n_dims != nd || t->shape[0] != d0 || (nd == 2 && t->shape[1] != d1)) {
        fmt_shape(hs, sizeof hs, t->n_dims, t->shape);
        return tsr_error_set_at(err, TSR_ERR_FORMAT, file, 0, 0,
                                "tensor \"%s\" has shape %s but the config implies %s", name, hs,
                                ws);
    }
    if (t->dtype >= TSR_DTYPE_COUNT)
        return tsr_error_set_at(err, TSR_ERR_UNSUPPORTED, file, 0, 0,
                                "tensor \"%s\" has an unsupported dtype", name);
    return TSR_OK;
}

int tsr_config_check_tensors(tsr_model_config *cfg, const tsr_tensor_table *tab,
                             const char *file, tsr_error *err) {
    const int64_t H = cfg->hidden, V = cfg->vocab, hd = cfg->head_dim;
    const int64_t q = (int64_t)cfg->n_heads * hd, kv = (int64_t)cfg->n_kv_heads * hd;
    CK(expect(tab, file, err, 1, 2, V, H, "model.embed_tokens.weight"));
    CK(expect(tab, file, err, 1, 1, H, 0, "model.norm.weight"));
    CK(expect(tab, file, err, !cfg->tie_embeddings, 2, V, H, "lm_head.weight"));
    int mix = cfg->arch == TSR_ARCH_MIXTRAL;
    for (int l = 0; l < cfg->n_layers; l++) {
        char p[64];
        snprintf(p, sizeof p, "model.layers.%d.", l);
        CK(expect(tab, file, err, 1, 1, H, 0, "%sinput_layernorm.weight", p));
        CK(expect(tab, file, err, 1, 1, H, 0, "%spost_attention_layernorm.weight", p));
        CK(expect(tab, file, err, 1, 2, q, H, "%sself_attn.q_proj.weight", p));
        CK(expect(tab, file, err, 1, 2, kv, H, "%sself_attn.k_proj.weight", p));
        CK(expect(tab, file, err, 1, 2, kv, H, "%sself_attn.v_proj.weight", p));
        CK(expect(tab, file, err, 1, 2, H, q, "%sself_attn.o_proj.weight", p));
        if (cfg->attn_bias) {
            CK(expect(tab, file, err, 1, 1, q, 0, "%sself_attn.q_proj.bias", p));
            CK(expect(tab, file, err, 1, 1, kv, 0, "%sself_attn.k_proj.bias", p));
            CK(expect(tab, file, err, 1, 1, kv, 0, "%sself_attn.v_proj.bias", p));
        }
        if (cfg->attn_out_bias) CK(expect(tab, file, err, 1, 1, H, 0, "%sself_attn.o_proj.bias", p));
        if (cfg->qk_norm) {
            CK(expect(tab, file, err, 1, 1, hd, 0, "%sself_attn.q_norm.weight", p));
            CK(expect(tab, file, err, 1, 1, hd, 0, "%sself_attn.k_norm.weight", p));
        }
        if (!cfg->layer_moe[l]) {
            const int64_t F = cfg->ffn;
            CK(expect(tab, file, err, 1, 2, F, H, "%smlp.gate_proj.weight", p));
            CK(expect(tab, file, err, 1, 2, F, H, "%smlp.up_proj.weight", p));
            CK(expect(tab, file, err, 1, 2, H, F, "%smlp.down_proj.weight", p));
            continue;
        }
        const int64_t E = cfg->n_experts, F = cfg->expert_ffn;
        CK(expect(tab, file, err, 1, 2, E, H, mix ? "%sblock_sparse_moe.gate.weight"
                                                 : "%smlp.gate.weight", p));
        for (int e = 0; e < cfg->n_experts; e++) {
            if (mix) {
                CK(expect(tab, file, err, 1, 2, F, H, "%sblock_sparse_moe.experts.%d.w1.weight", p, e));
                CK(expect(tab, file, err, 1, 2, H, F, "%sblock_sparse_moe.experts.%d.w2.weight", p, e));
                CK(expect(tab, file, err, 1, 2, F, H, "%sblock_sparse_moe.experts.%d.w3.weight", p, e));
            } else {
                CK(expect(tab, file, err, 1, 2, F, H, "%smlp.experts.%d.gate_proj.weight", p, e));
                CK(expect(tab, file, err, 1, 2, F, H, "%smlp.experts.%d.up_proj.weight", p, e));
                CK(expect(tab, file, err, 1, 2, H, F, "%smlp.experts.%d.down_proj.weight", p, e));
            }
        }
        if (cfg->shared_expert_ffn > 0) {
            const int64_t S = cfg->shared_expert_ffn;
            CK(expect(tab, file, err, 1, 2, S, H, "%smlp.shared_expert.gate_proj.weight", p));
            CK(expect(tab, file, err, 1, 2, S, H, "%smlp.shared_expert.up_proj.weight", p));
            CK(expect(tab, file, err, 1, 2, H, S, "%smlp.shared_expert.down_proj.weight", p));
            CK(expect(tab, file, err, 1, 2, 1, H, "%smlp.shared_expert_gate.weight", p));
        }
    }
    cfg->dtype = tsr_table_find(tab, "model.layers.0.self_attn.q_proj.weight")->dtype;
    return TSR_OK;
}

/* --- GGUF tensor names -------------------------------------------------------------------- */

/* GGUF name <-> Hugging Face name: whole tensors, and the stems of a layer's
 * tensors (blk.N.STEM.weight <-> model.layers.N.HF.weight). */
static const struct {
    const char *g, *hf;
} g_top[] = {{"token_embd.weight", "model.embed_tokens.weight"},
             {"output_norm.weight", "model.norm.weight"},
             {"output.weight", "lm_head.weight"}};
static const struct {
    const char *g, *hf;
} g_blk[] = {
    {"attn_q", "self_attn.q_proj"},       {"attn_k", "self_attn.k_proj"},
    {"attn_v", "self_attn.v_proj"},       {"attn_output", "self_attn.o_proj"},
    {"attn_q_norm", "self_attn.q_norm"},  {"attn_k_norm", "self_attn.k_norm"},
    {"attn_norm", "input_layernorm"},     {"ffn_norm", "post_attention_layernorm"},
    {"ffn_gate", "mlp.gate_proj"},        {"ffn_up", "mlp.up_proj"},
    {"ffn_down", "mlp.down_proj"},        {"ffn_gate_shexp", "mlp.shared_expert.gate_proj"},
    {"ffn_up_shexp", "mlp.shared_expert.up_proj"},
    {"ffn_down_shexp", "mlp.shared_expert.down_proj"},
    {"ffn_gate_inp_shexp", "mlp.shared_expert_gate"},
};

int tsr_hf_name_to_gguf(const char *hf, char *out, size_t size) {
    for (size_t i = 0; i < sizeof g_top / sizeof g_top[0]; i++)
        if (strcmp(hf, g_top[i].hf) == 0) return snprintf(out, size, "%s", g_top[i].g) < (int)size;
    unsigned layer;
    int n = 0;
    if (sscanf(hf, "model.layers.%u.%n", &layer, &n) != 1 || n == 0) return 0;
    const char *rest = hf + n, *dot = strrchr(rest, '.');
    if (!dot || (strcmp(dot, ".weight") != 0 && strcmp(dot, ".bias") != 0)) return 0;
    for (size_t i = 0; i < sizeof g_blk / sizeof g_blk[0]; i++)
        if (strlen(g_blk[i].hf) == (size_t)(dot - rest) && strncmp(rest, g_blk[i].hf, (size_t)(dot - rest)) == 0)
            return snprintf(out, size, "blk.%u.%s%s", layer, g_blk[i].g, dot) < (int)size;
    return 0;
}

int tsr_gguf_name_to_hf(const char *gn, tsr_arch arch, char *out, size_t size) {
    for (size_t i = 0; i < sizeof g_top / sizeof g_top[0]; i++)
        if (strcmp(gn, g_top[i].g) == 0) return snprintf(out, size, "%s", g_top[i].hf) < (int)size;
    int mix = arch == TSR_ARCH_MIXTRAL;
    unsigned layer;
    int n = 0;
    if (sscanf(gn, "blk.%u.%n", &layer, &n) != 1 || n == 0 || layer >= TSR_MAX_LAYERS) return 0;
    const char *rest = gn + n;
    const char *dot = strrchr(rest, '.');
    if (!dot || (strcmp(dot, ".weight") != 0 && strcmp(dot, ".bias") != 0)) return 0;
    size_t stem = (size_t)(dot - rest);
    if (stem == 12 && strncmp(rest, "ffn_gate_inp", 12) == 0)
        return snprintf(out, size, "model.layers.%u.%s%s", layer,
                        mix ? "block_sparse_moe.gate" : "mlp.gate", dot) < (int)size;
    for (size_t i = 0; i < sizeof g_blk / sizeof g_blk[0]; i++)
        if (strlen(g_blk[i].g) == stem && strncmp(rest, g_blk[i].g, stem) == 0)
            return snprintf(out, size, "model.layers.%u.%s%s", layer, g_blk[i].hf, dot) < (int)size;
    /* older split experts: blk.N.ffn_gate.E.weight */
    unsigned e;
    char which[8];
    int m = 0;
    if (sscanf(rest, "ffn_%4[a-z].%u.weight%n", which, &e, &m) == 2 && rest[m] == '\0') {
        const char *hf = NULL;
        if (strcmp(which, "gate") == 0) hf = mix ? "w1" : "gate_proj";
        if (strcmp(which, "down") == 0) hf = mix ? "w2" : "down_proj";
        if (strcmp(which, "up") == 0) hf = mix ? "w3" : "up_proj";
        if (!hf) return 0;
        return snprintf(out, size, "model.layers.%u.%s.%u.%s.weight", layer,
                        mix ? "block_sparse_moe.experts" : "mlp.experts", e, hf) < (int)size;
    }
    return 0;
}
