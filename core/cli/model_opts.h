/*
 * model_opts.h - the options every model-running command shares:
 * [ASSEMBLY] --model PATH --tokenizer PATH --threads N --catalog DIR --ctx N.
 */
#ifndef TSR_CLI_MODEL_OPTS_H
#define TSR_CLI_MODEL_OPTS_H

#include "../runtime/runtime.h"

#define TSR_MODEL_OPTS_HELP                                                                     \
    "  ASSEMBLY           assembly (YAML or Lua); default assemblies/cpu-reference.yaml\n"      \
    "  --model PATH       checkpoint: HF folder, .safetensors, .gguf or llama2.c .bin\n"       \
    "                     (default: the embedded stories260K)\n"                               \
    "  --tokenizer PATH   tokenizer.json or llama2.c tokenizer .bin (default: from the model)\n" \
    "  --threads N        worker threads (default: every core)\n"                              \
    "  --catalog DIR      plugin catalog (default: $TESSERA_CATALOG or <bin>/../catalog)\n"    \
    "  --ctx N            context length (default: the model's)\n"

/* Consume a model option at argv[*i] (advancing *i past its value) or the
 * positional assembly. Returns 1 if consumed, 0 if not a model option, -1 on
 * a bad value (message printed). */
int tsr_cli_model_opt(int argc, char **argv, int *i, tsr_model_opts *o, const char *cmd);

/* Parse a non-negative int / a float with range; -1 and a message on error. */
int tsr_cli_parse_int(const char *cmd, const char *opt, const char *s, long min, long max, long *out);
int tsr_cli_parse_float(const char *cmd, const char *opt, const char *s, double min, double max,
                        double *out);

#endif
