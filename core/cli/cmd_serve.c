/* Placeholder until this command lands: it says so and fails. */
#include <stdio.h>

#include "commands.h"

int tsr_cmd_serve(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "tessera serve: not implemented yet\n");
    return 2;
}
