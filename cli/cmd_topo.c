/* cmd_topo.c — `strata topo`: NUMA nodes, cores, caches, GPUs and NVMe
 * devices with their NUMA locality, and the node an instance should use
 * (st_topo.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_cmds.h"
#include "st_numa.h"
#include "st_topo.h"

int cli_cmd_topo(int argc, char **argv)
{
	struct st_diag diag = { "" };
	struct st_topo *t;
	int gpu = -1;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			printf("Usage: strata topo [--gpu N]\n\n"
			       "Prints the machine as strata sees it (hwloc): "
			       "NUMA nodes with their memory,\ncores and "
			       "caches; GPUs and NVMe devices with the node "
			       "they hang off; and\nthe node an instance "
			       "should use (--numa for strata up), for GPU N "
			       "when given.\n");
			return 0;
		}
		if (!strcmp(argv[i], "--gpu") && i + 1 < argc) {
			char *end;
			long v = strtol(argv[++i], &end, 10);

			if (end == argv[i] || *end || v < 0 || v > 1 << 20) {
				fprintf(stderr, "strata topo: --gpu '%s': give "
					"a GPU number (0, 1, ...)\n", argv[i]);
				return 2;
			}
			gpu = (int)v;
			continue;
		}
		fprintf(stderr, "strata topo: unknown argument '%s' (see "
			"--help)\n", argv[i]);
		return 2;
	}
	t = malloc(sizeof(*t));
	if (!t) {
		fprintf(stderr, "strata topo: out of memory\n");
		return 1;
	}
	if (st_topo_load(t, &diag) < 0) {
		fprintf(stderr, "strata topo: %s\n", diag.msg);
		free(t);
		return 1;
	}
	st_topo_print(t, stdout);
	if (gpu >= 0) {
		char why[256];
		int node, n_gpus = 0;

		for (int i = 0; i < t->n_devs; i++)
			n_gpus += t->devs[i].kind == ST_TOPO_GPU;
		if (gpu >= n_gpus) {
			fprintf(stderr, "strata topo: no GPU %d: hwloc found "
				"%d GPU%s on this machine (numbered from 0)\n",
				gpu, n_gpus, n_gpus == 1 ? "" : "s");
			free(t);
			return 1;
		}
		node = st_topo_pick_node(t, gpu, why, sizeof(why));
		printf("for GPU %d: --numa %d (%s)\n", gpu, node, why);
	}
	printf("kernel NUMA nodes: %d\n", st_numa_node_count());
	free(t);
	return 0;
}
