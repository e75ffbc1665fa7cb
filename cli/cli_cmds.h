/* cli_cmds.h — the subcommands of the strata CLI.  Each takes argv starting
 * at the command name and returns the process exit code (0 ok, 1 failure,
 * 2 usage error). */
#ifndef CLI_CMDS_H
#define CLI_CMDS_H

#include <stddef.h>

int cli_cmd_run(int argc, char **argv);
int cli_cmd_convert(int argc, char **argv);
int cli_cmd_verify(int argc, char **argv);
int cli_cmd_up(int argc, char **argv);
int cli_cmd_down(int argc, char **argv);
int cli_cmd_status(int argc, char **argv);

/* Helpers shared by the commands (cmd_convert.c). */
/* Default store directory for a model dir and expert format, under
 * $STRATA_CACHE_DIR or $XDG_CACHE_HOME/strata or ~/.cache/strata. */
int cli_default_store_dir(const char *model_dir, const char *experts,
			  char *buf, size_t len);
/* Converts model_dir into store_dir with a progress bar on a terminal.
 * experts: "mxfp4", "bf16" or "f32".  0 or 1 (error printed). */
int cli_convert(const char *model_dir, const char *store_dir,
		const char *experts, int dense_f32, int force);
/* Default embedded model directory (models/kjv-moe of the source tree or of
 * the installed data dir) into buf; 0 or -ENOENT. */
int cli_default_model_dir(char *buf, size_t len);

#endif
