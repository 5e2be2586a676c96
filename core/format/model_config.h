/*
 * model_config.h - one description of a model's architecture, filled from a
 * Hugging Face config.json (both the transformers-4 and transformers-5
 * spellings), from GGUF metadata, or from a llama2.c header.
 */
#ifndef TSR_MODEL_CONFIG_H
#define TSR_MODEL_CONFIG_H

#include <stdint.h>

#define TSR_MAX_LAYERS 512
#define TSR_MAX_EOS 8

typedef enum tsr_arch {
    TSR_ARCH_LLAMA = 0,
    TSR_ARCH_QWEN2 = 1,
    TSR_ARCH_QWEN3 = 2,
    TSR_ARCH_MIXTRAL = 3,
    TSR_ARCH_QWEN2_MOE = 4,
    TSR_ARCH_QWEN3_MOE = 5
} tsr_arch;

typedef enum tsr_rope_scaling {
    TSR_ROPE_NONE = 0,
    TSR_ROPE_LLAMA3 = 1,  /* rope_type "llama3": factor, low/high_freq_factor, original ctx */
    TSR_ROPE_LINEAR = 2   /* rope_type "linear": positions divided by factor */
} tsr_rope_scaling;

typedef struct tsr_model_config {
    tsr_arch arch;
    char arch_name[32];      /* "llama", "qwen2", ... (tsr_model_desc.arch) */
    int vocab;
    int hidden;
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;            /* hidden / n_heads unless given */
    int ffn;                 /* intermediate_size of dense MLPs */
    int max_ctx;             /* max_position_embeddings / context_length */
    float norm_eps;
    float rope_theta;
    int rope_interleaved;    /* 1: RoPE rotates pairs (2i, 2i+1) (llama2.c, GGUF llama
                              * whose q/k rows the converter permuted); 0: halves
                              * (i, i + head_dim/2) as transformers does */
    tsr_rope_scaling rope_scaling;
    float rope_factor;
    float rope_low_freq_factor;
    float rope_high_freq_factor;
    int rope_orig_ctx;       /* original_max_position_embeddings */
    int tie_embeddings;      /* output head reads embed_tokens */
    int attn_bias;           /* q/k/v projections have biases (qwen2) */
    int attn_out_bias;       /* o_proj has a bias */
    int qk_norm;             /* RMSNorm of q and k per head (qwen3) */
    int sliding_window;      /* 0: none */
    /* mixture of experts (0 for dense models) */
    int n_experts;
    int n_experts_used;
    int expert_ffn;          /* moe_intermediate_size (mixtral: intermediate_size) */
    int norm_topk_prob;      /* renormalise the top-k routing weights */
    int shared_expert_ffn;   /* qwen2_moe shared expert width, 0 if none */
    uint8_t layer_moe[TSR_MAX_LAYERS]; /* 1 if layer i uses experts */
    /* tokens */
    int bos;                 /* -1 if none */
    int eos[TSR_MAX_EOS];
    int n_eos;
    uint32_t dtype;          /* tsr_dtype most projection weights are stored in */
    /* config.json quantization_config (FP8 checkpoints, docs/FORMATS.md) */
    char quant_method[32];   /* "" (none), "fp8", "compressed-tensors", "fbgemm_fp8" */
    int quant_act_dynamic;   /* 1: activations are not quantised with stored scales (dynamic
                              * or none), so input_scale tensors may be ignored */
    int quant_block[2];      /* weight_block_size [rows, cols] of "fp8"; 0 if none */
} tsr_model_config;


struct tsr_error;

/* "llama", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe"; -1 if
 * unknown. */
int tsr_arch_from_name(const char *name);
const char *tsr_arch_name(tsr_arch arch);

/* Read a Hugging Face config.json (either spelling) into cfg. Fields the
 * model cannot be built without (model_type, vocab_size, hidden_size,
 * num_hidden_layers, num_attention_heads, intermediate_size where a dense MLP
 * exists, the expert counts and widths of MoE families) are required; others
 * take the transformers defaults of the family. cfg->dtype is left
 * TSR_DTYPE_COUNT: tsr_model_file_open sets it from the tensors. Errors name
 * the file and the field. */
int tsr_model_config_load(const char *config_json_path, tsr_model_config *cfg,
                          struct tsr_error *err);

#endif /* TSR_MODEL_CONFIG_H */
