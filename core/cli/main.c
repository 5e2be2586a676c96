/* tessera - the command-line front end: one subcommand per job. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "tsr_build_info.h" /* TSR_BUILD_COMMIT: cmake/build_info.cmake */

typedef struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"run", tsr_cmd_run, "generate text from a prompt with an assembled engine"},
    {"passes", tsr_cmd_passes, "time forward passes by row count (decode vs verifying drafts)"},
    {"score", tsr_cmd_score, "write the logits of every position of a token sequence"},
    {"serve", tsr_cmd_serve, "serve an assembled engine over an OpenAI-compatible HTTP API"},
    {"check", tsr_cmd_check, "check an assembly against the catalog and print the engine"},
    {"plugins", tsr_cmd_plugins, "list, show and call plugins of the catalog"},
    {"probe", tsr_cmd_probe, "measure this machine's ceilings (read bandwidth, GEMM rate)"},
    {"bench", tsr_cmd_bench, "measure a served engine against its ceilings"},
    {"ablate", tsr_cmd_ablate, "each plugin's share of an assembly's speedup, with quality"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: tessera [--version] [--help] COMMAND [ARGS...]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n'tessera COMMAND --help' describes a command.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("tessera %s (built from %s)\n", TESSERA_VERSION, TSR_BUILD_COMMIT);
        return 0;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "tessera: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
