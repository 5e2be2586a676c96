/* tessera plugins: list the catalog, show one manifest, call an export. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "../host/catalog.h"
#include "../host/diag.h"
#include "../host/ffi.h"
#include "../host/loader.h"
#include "commands.h"
#include "scaffold.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: tessera plugins [--catalog DIR]\n"
            "       tessera plugins show NAME [--catalog DIR]\n"
            "       tessera plugins call NAME FN [ARGS...] [--catalog DIR]\n"
            "       tessera plugins new SLOT NAME\n"
            "\n"
            "List the plugins of the catalog (default: $TESSERA_CATALOG, else <exe dir>/../catalog),\n"
            "show one plugin's manifest, or call a function the plugin exports (its manifest's\n"
            "exports): arguments are parsed by the declared types (bool, int32, int64, uint32,\n"
            "uint64, float, double, string) and the result is printed. Exit status 2 on bad\n"
            "input or a refused library.\n"
            "'new' writes a plugin scaffold (plugins/NAME/, manifests/NAME.yaml) into the source\n"
            "tree ($TESSERA_SOURCE_DIR, else the tree the binary was built from); see CONTRIBUTING.md.\n");
}

/* tessera plugins new SLOT NAME (core/cli/scaffold.c writes the files). */
static int plugins_new(int npos, char **pos) {
    if (npos != 3) {
        usage(stderr);
        return 2;
    }
    tsr_error err;
    tsr_error_clear(&err);
    char paths[4096];
    if (tsr_scaffold_plugin(tsr_cli_source_dir(), pos[1], pos[2], paths, sizeof paths, &err) != TSR_OK) {
        fprintf(stderr, "tessera plugins new: %s\n", err.msg);
        return 2;
    }
    printf("%s", paths);
    printf("next: re-run cmake and build; `test_conformance %s` fails until the stubs are implemented\n", pos[2]);
    return 0;
}

static void print_values(const tsr_mcap *c) {
    if (c->n_values != 1) printf("[");
    for (int j = 0; j < c->n_values; j++) printf("%s%s", j ? ", " : "", c->values[j]);
    if (c->n_values != 1) printf("]");
}

static void show(const tsr_manifest *m) {
    char devs[32], base[32];
    tsr_devmask_format(m->devices, devs, sizeof devs);
    tsr_devmask_format(m->baseline, base, sizeof base);
    printf("name:        %s%s\n", m->name, m->test ? " (test plugin)" : "");
    printf("slot:        %s\n", tsr_slot_name(m->slot));
    printf("version:     %s\n", m->version);
    printf("abi:         %d.%d\n", m->abi_major, m->abi_minor);
    printf("manifest:    %s\n", m->path);
    printf("library:     %s\n", m->library_path);
    printf("sha256:      %s\n", m->sha256);
    printf("devices:     %s\n", devs);
    printf("exactness:   %s\n", m->exact ? "exact" : "lossy");
    if (m->has_quality) printf("quality:     max_mean_kl %g, max_ppl_ratio %g\n", m->max_mean_kl, m->max_ppl_ratio);
    printf("baseline:    %s\n", m->baseline ? base : "-");
    if (m->description) printf("description: %s\n", m->description);
    if (m->n_provides) printf("provides:\n");
    for (int i = 0; i < m->n_provides; i++) {
        printf("  %s: ", m->provides[i].key);
        print_values(&m->provides[i]);
        printf("\n");
    }
    if (m->n_requires) printf("requires:\n");
    for (int i = 0; i < m->n_requires; i++) {
        printf("  %s: ", m->requires[i].key);
        print_values(&m->requires[i]);
        printf("\n");
    }
    static const char *const tn[] = {"int", "float", "bool", "string"};
    if (m->n_params) printf("params:\n");
    for (int i = 0; i < m->n_params; i++) {
        const tsr_mparam *p = &m->params[i];
        char def[256];
        tsr_param_format(&p->def, def, sizeof def);
        printf("  %s: %s, default %s", p->name, tn[p->type], def);
        if (p->has_min) printf(", min %.17g", p->min);
        if (p->has_max) printf(", max %.17g", p->max);
        if (p->n_values) {
            printf(", one of [");
            for (int j = 0; j < p->n_values; j++) printf("%s%s", j ? ", " : "", p->values[j]);
            printf("]");
        }
        if (p->description) printf(" - %s", p->description);
        printf("\n");
    }
    if (m->n_exports) printf("exports:\n");
    for (int i = 0; i < m->n_exports; i++) {
        char sig[256];
        tsr_ffi_sig_format(&m->exports[i].sig, sig, sizeof sig);
        printf("  %s: %s\n", m->exports[i].name, sig);
    }
}

static int call(const tsr_manifest *m, const char *fn, int argc, char **argv) {
    const tsr_mexport *ex = tsr_manifest_export(m, fn);
    if (!ex) {
        fprintf(stderr, "tessera plugins call: plugin %s exports no '%s'\n", m->name, fn);
        return 2;
    }
    if (argc != ex->sig.n_args) {
        char sig[256];
        tsr_ffi_sig_format(&ex->sig, sig, sizeof sig);
        fprintf(stderr, "tessera plugins call: %s takes %d argument%s (%s), got %d\n", fn, ex->sig.n_args,
                ex->sig.n_args == 1 ? "" : "s", sig, argc);
        return 2;
    }
    tsr_ffi_value args[TSR_FFI_MAX_ARGS];
    tsr_error err;
    tsr_error_clear(&err);
    for (int i = 0; i < argc; i++)
        if (tsr_ffi_value_parse(ex->sig.args[i], argv[i], &args[i], &err)) {
            fprintf(stderr, "tessera plugins call: argument %d: %s\n", i + 1, err.msg);
            return 2;
        }
    void *h = NULL;
    void (*f)(void) = NULL;
    char buf[2048];
    if (tsr_export_bind(m, fn, &h, &f, &err)) {
        fprintf(stderr, "%s\n", tsr_error_format(&err, buf, sizeof buf));
        return 2;
    }
    tsr_ffi_value ret;
    int rc = tsr_ffi_call(f, &ex->sig, args, argc, &ret, &err);
    if (rc == TSR_OK) {
        tsr_ffi_value_format(&ret, buf, sizeof buf);
        printf("%s\n", buf);
    } else {
        fprintf(stderr, "tessera plugins call: %s\n", err.msg);
    }
    dlclose(h);
    return rc == TSR_OK ? 0 : 2;
}

int tsr_cmd_plugins(int argc, char **argv) {
    if (tsr_cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    const char *catalog = NULL;
    char *pos[64];
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--catalog") && i + 1 < argc) catalog = argv[++i];
        else if (npos < 64) pos[npos++] = argv[i];
    }
    if (npos > 0 && !strcmp(pos[0], "new")) return plugins_new(npos, pos);
    if (npos > 0 && strcmp(pos[0], "show") && strcmp(pos[0], "call")) {
        fprintf(stderr, "tessera plugins: unknown subcommand '%s'\n", pos[0]);
        usage(stderr);
        return 2;
    }
    if (npos > 0 && ((!strcmp(pos[0], "show") && npos != 2) || (!strcmp(pos[0], "call") && npos < 3))) {
        usage(stderr);
        return 2;
    }
    tsr_diag d;
    tsr_diag_init(&d);
    tsr_catalog *cat = NULL;
    if (tsr_catalog_load(catalog ? catalog : tsr_cli_default_catalog(), &cat, &d)) {
        tsr_diag_print(&d, stderr);
        tsr_diag_free(&d);
        return 2;
    }
    tsr_diag_free(&d);
    int status = 0;
    if (npos == 0) {
        printf("%-22s %-13s %-8s %-10s %-6s %-9s %s\n", "NAME", "SLOT", "VERSION", "DEVICES", "EXACT", "BASELINE",
               "DESCRIPTION");
        for (int i = 0; i < cat->n; i++) {
            const tsr_manifest *m = cat->items[i];
            char devs[32], base[32];
            tsr_devmask_format(m->devices, devs, sizeof devs);
            tsr_devmask_format(m->baseline, base, sizeof base);
            printf("%-22s %-13s %-8s %-10s %-6s %-9s %s%s\n", m->name, tsr_slot_name(m->slot), m->version, devs,
                   m->exact ? "exact" : "lossy", m->baseline ? base : "-", m->test ? "[test] " : "",
                   m->description ? m->description : "");
        }
        if (!cat->n) printf("(no plugins in %s)\n", cat->dir);
    } else {
        const tsr_manifest *m = tsr_catalog_find(cat, pos[1]);
        if (!m) {
            fprintf(stderr, "tessera plugins: no plugin '%s' in %s\n", pos[1], cat->dir);
            status = 2;
        } else if (!strcmp(pos[0], "show")) {
            show(m);
        } else {
            status = call(m, pos[2], npos - 3, pos + 3);
        }
    }
    tsr_catalog_free(cat);
    return status;
}
