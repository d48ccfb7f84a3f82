/*
 * commands: one function per `leash COMMAND`, each in its own cmd_<name>.c. argv[0] is the
 * command's name; the function parses the rest (global options included) and returns the
 * process exit code (0 success, 1 runtime failure, 2 usage or data error).
 */
#ifndef LEASH_COMMANDS_H
#define LEASH_COMMANDS_H

#include "cli.h"

int cmd_migrate(struct cli *g, int argc, char **argv);
int cmd_enqueue(struct cli *g, int argc, char **argv);
int cmd_status(struct cli *g, int argc, char **argv);
int cmd_run(struct cli *g, int argc, char **argv);
int cmd_check(struct cli *g, int argc, char **argv);
int cmd_report(struct cli *g, int argc, char **argv);
int cmd_requeue(struct cli *g, int argc, char **argv);
int cmd_inspect(struct cli *g, int argc, char **argv);
int cmd_prune(struct cli *g, int argc, char **argv);
int cmd_fixture(struct cli *g, int argc, char **argv);
int cmd_replay(struct cli *g, int argc, char **argv);
int cmd_tenant(struct cli *g, int argc, char **argv);
int cmd_budget(struct cli *g, int argc, char **argv);
int cmd_pause(struct cli *g, int argc, char **argv);
int cmd_spend(struct cli *g, int argc, char **argv);
int cmd_resume(struct cli *g, int argc, char **argv);
int cmd_cancel(struct cli *g, int argc, char **argv);
int cmd_release(struct cli *g, int argc, char **argv);
int cmd_dashboard(struct cli *g, int argc, char **argv);
int cmd_signal(struct cli *g, int argc, char **argv);
int cmd_canary(struct cli *g, int argc, char **argv);

/* The global options' help lines, shared by every command's --help. */
extern const char cli_global_help[];

#endif
