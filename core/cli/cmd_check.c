/* tessera check: check an assembly against the catalog (and a model's config)
 * and print the resolved engine, or every problem found. */
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "../format/model_file.h"
#include "../host/diag.h"
#include "../host/engine.h"
#include "commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: tessera check ASSEMBLY [--model PATH] [--catalog DIR] [--allow-test]\n"
            "\n"
            "Check ASSEMBLY (a .yaml/.yml file or a .lua script; a bare name is looked up\n"
            "in the source tree's assemblies/) against the catalog's manifests, load every\n"
            "plugin it names and cross-check their descriptors, then print the resolved\n"
            "engine: slot, plugin, version, exactness, params and capabilities.\n"
            "Exit status 0 when it passes; otherwise every problem is printed as\n"
            "file:line:col: error: ... and the exit status is 2.\n"
            "\n"
            "  --model PATH    also check the plugins' model requirements against the\n"
            "                  model's config (without it they are listed as not checked)\n"
            "  --catalog DIR   the folder of manifests (default: $TESSERA_CATALOG, else\n"
            "                  <exe dir>/../catalog)\n"
            "  --allow-test    accept test plugins (for tests only)\n");
}

/* A bare name ("cpu-reference") means <source>/assemblies/NAME.yaml or .lua. */
static const char *find_assembly(const char *arg, char *buf, size_t size) {
    struct stat st;
    if (strchr(arg, '/') || stat(arg, &st) == 0) return arg;
    static const char *const exts[] = {"", ".yaml", ".yml", ".lua"};
    for (size_t i = 0; i < sizeof exts / sizeof exts[0]; i++) {
        snprintf(buf, size, "%s/assemblies/%s%s", tsr_cli_source_dir(), arg, exts[i]);
        if (stat(buf, &st) == 0) return buf;
    }
    return arg;
}

int tsr_cmd_check(int argc, char **argv) {
    if (tsr_cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    const char *assembly = NULL, *model = NULL, *catalog = NULL;
    int allow_test = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--catalog") && i + 1 < argc) catalog = argv[++i];
        else if (!strcmp(argv[i], "--allow-test")) allow_test = 1;
        else if (argv[i][0] == '-' || assembly) {
            fprintf(stderr, "tessera check: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        } else assembly = argv[i];
    }
    if (!assembly) {
        usage(stderr);
        return 2;
    }
    char path[PATH_MAX + 64];
    assembly = find_assembly(assembly, path, sizeof path);

    tsr_model_file *mf = NULL;
    const tsr_model_config *cfg = NULL;
    if (model) {
        tsr_error err;
        tsr_error_clear(&err);
        if (tsr_model_file_open(model, &mf, &err) != TSR_OK) {
            char buf[2048];
            fprintf(stderr, "%s\n", tsr_error_format(&err, buf, sizeof buf));
            return 2;
        }
        cfg = tsr_model_file_config(mf);
    }
    tsr_engine_opts opts = {.catalog_dir = catalog ? catalog : tsr_cli_default_catalog(),
                            .allow_test = allow_test,
                            .no_init = 1};
    tsr_diag d;
    tsr_diag_init(&d);
    tsr_engine *e = NULL;
    int rc = tsr_engine_open_diag(assembly, cfg, NULL, &opts, &e, &d);
    int status = 0;
    if (rc != TSR_OK) {
        tsr_diag_print(&d, stderr);
        fprintf(stderr, "tessera check: %s: refused (%d error%s)\n", assembly, tsr_diag_count(&d),
                tsr_diag_count(&d) == 1 ? "" : "s");
        status = 2;
    } else {
        tsr_engine_describe(e, stdout);
        for (int i = 0; i < d.n_notes; i++) printf("note: %s\n", d.notes[i]);
        printf("ok: %s passes%s\n", assembly, model ? " against the model" : " (no model given)");
    }
    tsr_engine_free(e);
    tsr_diag_free(&d);
    tsr_model_file_close(mf);
    return status;
}
