/*
 * commands.h - the subcommands of the tessera CLI. Each takes the arguments
 * after its name (argv[0] is the subcommand) and returns the exit status:
 * 0 success, 1 runtime failure, 2 bad input or refused configuration.
 */
#ifndef TSR_CLI_COMMANDS_H
#define TSR_CLI_COMMANDS_H

int tsr_cmd_check(int argc, char **argv);   /* cmd_check.c   */
int tsr_cmd_plugins(int argc, char **argv); /* cmd_plugins.c */
int tsr_cmd_run(int argc, char **argv);     /* cmd_run.c     */
int tsr_cmd_score(int argc, char **argv);   /* cmd_score.c   */
int tsr_cmd_serve(int argc, char **argv);   /* cmd_serve.c   */
int tsr_cmd_probe(int argc, char **argv);   /* cmd_probe.c   */
int tsr_cmd_bench(int argc, char **argv);   /* cmd_bench.c   */
int tsr_cmd_ablate(int argc, char **argv);  /* cmd_ablate.c  */
int tsr_cmd_passes(int argc, char **argv);  /* cmd_passes.c  */

/* Shared helpers (cli_util.c). */
/* Directory of the running executable (no trailing slash). */
const char *tsr_cli_exe_dir(void);
/* Default catalog: $TESSERA_CATALOG, else <exe dir>/../catalog. */
const char *tsr_cli_default_catalog(void);
/* The source tree the binary was built from (assemblies/, models/). */
const char *tsr_cli_source_dir(void);
/* 1 if argv[i] is -h or --help. */
int tsr_cli_wants_help(int argc, char **argv);

#endif
