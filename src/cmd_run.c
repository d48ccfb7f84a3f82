#include "commands.h"
int cmd_run(struct cli *g, int argc, char **argv)
{
  (void)argc; (void)argv;
  return cli_runtime_error(g, "not built yet");
}
int cmd_check(struct cli *g, int argc, char **argv)
{
  (void)argc; (void)argv;
  return cli_runtime_error(g, "not built yet");
}
