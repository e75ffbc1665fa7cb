/*
 * test_numa.c — topology and NUMA placement (common/st_topo.c,
 * common/st_numa.c) on whatever machine runs it (a one-node machine
 * included): hwloc sees at least one node with cores and memory; a shm
 * segment bound to node 0 with mbind has every page the kernel reports
 * (move_pages) on node 0; the process binding sets the CPU affinity to the
 * node's cores and an MPOL_BIND memory policy; bad policies are refused
 * with a message naming the allowed values.
 */
#include <errno.h>
#include <numaif.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "st_numa.h"
#include "st_shm.h"
#include "st_topo.h"
#include "test_util.h"

static void test_topology(void **state)
{
	struct st_topo *t = malloc(sizeof(*t));
	struct st_diag d;
	char why[256];
	int node, cpus = 0;

	(void)state;
	assert_non_null(t);
	assert_int_equal(st_topo_load(t, &d), 0);
	assert_true(t->n_nodes >= 1);
	assert_true(t->n_cores >= 1);
	assert_true(t->n_pus >= t->n_cores);
	assert_true(t->mem_bytes > 0);
	for (int i = 0; i < t->n_nodes; i++)
		cpus += t->nodes[i].n_pus;
	/* the nodes partition the machine's hardware threads */
	assert_int_equal(cpus, t->n_pus);
	assert_int_equal(t->n_nodes, st_numa_node_count());
	node = st_topo_pick_node(t, -1, why, sizeof(why));
	assert_true(st_topo_node_index(t, node) >= 0);
	assert_true(strlen(why) > 0);
	if (t->n_nodes == 1)
		assert_non_null(strstr(why, "only NUMA node"));
	free(t);
}

static void test_policy_parse(void **state)
{
	struct st_numa_policy p;
	struct st_diag d;
	char buf[32];

	(void)state;
	assert_int_equal(st_numa_policy_parse("auto", &p, &d), 0);
	assert_int_equal(p.mode, ST_NUMA_AUTO);
	assert_int_equal(st_numa_policy_parse("interleave", &p, &d), 0);
	assert_int_equal(p.mode, ST_NUMA_INTERLEAVE);
	assert_int_equal(st_numa_policy_parse("3", &p, &d), 0);
	assert_int_equal(p.mode, ST_NUMA_NODE);
	assert_int_equal(p.node, 3);
	assert_string_equal(st_numa_policy_str(&p, buf, sizeof(buf)), "node 3");
	assert_int_equal(st_numa_policy_parse(NULL, &p, &d), 0);
	assert_int_equal(p.mode, ST_NUMA_OFF);
	assert_int_equal(st_numa_policy_parse("near", &p, &d), -EINVAL);
	assert_non_null(strstr(d.msg, "auto, interleave"));
	assert_int_equal(st_numa_policy_parse("-1", &p, &d), -EINVAL);
	assert_int_equal(st_numa_policy_parse("64", &p, &d), -EINVAL);
	/* a node the machine lacks */
	assert_int_equal(st_numa_policy_parse("63", &p, &d), 0);
	assert_int_equal(st_numa_resolve(&p, NULL, &d), -EINVAL);
	assert_non_null(strstr(d.msg, "no such NUMA node"));
	/* auto resolves to a node that exists */
	assert_int_equal(st_numa_policy_parse("auto", &p, &d), 0);
	assert_int_equal(st_numa_resolve(&p, NULL, &d), 0);
	assert_int_equal(p.mode, ST_NUMA_NODE);
	assert_true(p.node >= 0 && p.node < st_numa_node_count());
}

/* A segment bound to node 0: every resident page is on node 0. */
static void test_segment_on_node0(void **state)
{
	struct st_numa_policy p = { ST_NUMA_NODE, 0 };
	struct st_shm shm;
	struct st_diag d;
	char inst[64];
	uint64_t pages[ST_NUMA_MAX_NODES], absent, sum = 0;
	size_t size = 8u << 20, touched = 3u << 20;

	(void)state;
	st_test_instance("numa", inst, sizeof(inst));
	assert_int_equal(st_shm_create(&shm, inst, "numatest", 1, 0, size), 0);
	assert_int_equal(st_numa_bind_range(shm.base, shm.size, &p, &d), 0);
	/* first touch after the bind: 3 MiB of pages */
	memset((char *)shm.base + ST_SHM_HEADER_BYTES, 0x5a,
	       touched - ST_SHM_HEADER_BYTES);
	assert_int_equal(st_numa_query_range(shm.base, shm.size, pages,
					     &absent), 0);
	for (int n = 0; n < ST_NUMA_MAX_NODES; n++)
		sum += pages[n];
	/* the kernel may fault a few pages around ours in (read-around):
	 * at least the touched ones are resident, and all on node 0 */
	assert_true(pages[0] >= touched / 4096);
	assert_true(sum == pages[0]);
	assert_true(pages[0] + absent == shm.size / 4096);

	/* the binding belongs to the shm object: another mapping of the
	 * segment (as computed's) places its first touches on node 0 too */
	{
		struct st_shm other;

		assert_int_equal(st_shm_attach(&other, inst, "numatest", 1, 0,
					       &d), 0);
		memset((char *)other.base + touched, 0xa5, 1u << 20);
		assert_int_equal(st_numa_query_range(other.base, other.size,
						     pages, &absent), 0);
		assert_true(pages[0] >= (touched + (1u << 20)) / 4096);
		st_shm_detach(&other);
	}
	st_shm_destroy(&shm);

	/* interleave over every node with memory: on a one-node machine
	 * that is node 0 again; elsewhere more than one node gets pages */
	p.mode = ST_NUMA_INTERLEAVE;
	assert_int_equal(st_shm_create(&shm, inst, "numatest", 1, 0, size), 0);
	assert_int_equal(st_numa_bind_range(shm.base, shm.size, &p, &d), 0);
	memset((char *)shm.base + ST_SHM_HEADER_BYTES, 0x5a,
	       size - ST_SHM_HEADER_BYTES);
	assert_int_equal(st_numa_query_range(shm.base, shm.size, pages,
					     &absent), 0);
	{
		int used = 0;

		sum = 0;
		for (int n = 0; n < ST_NUMA_MAX_NODES; n++) {
			sum += pages[n];
			used += pages[n] > 0;
		}
		assert_true(sum == shm.size / 4096);
		if (st_numa_node_count() == 1)
			assert_true(pages[0] == sum);
		else
			assert_true(used > 1);
	}
	st_shm_destroy(&shm);

	/* an unresolved policy is refused rather than guessed */
	p.mode = ST_NUMA_AUTO;
	assert_int_equal(st_numa_bind_range(shm.base, 4096, &p, &d), -EINVAL);
}

/* Binding the process: affinity inside the node's cpus, MPOL_BIND. */
static void test_bind_self(void **state)
{
	struct st_numa_policy p;
	struct st_topo *t = malloc(sizeof(*t));
	struct st_diag d;
	char what[160];
	cpu_set_t set;
	unsigned long mask[2] = { 0 };
	int mode = -1, n;

	(void)state;
	assert_non_null(t);
	assert_int_equal(st_topo_load(t, &d), 0);
	assert_int_equal(st_numa_daemon_setup("0", &p, what, sizeof(what), &d),
			 0);
	assert_non_null(strstr(what, "node 0"));
	assert_int_equal(sched_getaffinity(0, sizeof(set), &set), 0);
	n = st_topo_node_index(t, 0);
	assert_true(n >= 0);
	assert_true(CPU_COUNT(&set) >= 1);
	assert_true(CPU_COUNT(&set) <= t->nodes[n].n_pus);
	assert_int_equal(get_mempolicy(&mode, mask, 128, NULL, 0), 0);
	assert_int_equal(mode, MPOL_BIND);
	assert_true(mask[0] & 1ul);
	/* a fresh allocation now lands on node 0 */
	{
		size_t len = 1u << 20;
		char *buf = aligned_alloc(4096, len);
		uint64_t pages[ST_NUMA_MAX_NODES], absent;

		assert_non_null(buf);
		memset(buf, 1, len);
		assert_int_equal(st_numa_query_range(buf, len, pages, &absent),
				 0);
		assert_true(pages[0] >= len / 4096);
		free(buf);
	}
	free(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_topology),
		cmocka_unit_test(test_policy_parse),
		cmocka_unit_test(test_segment_on_node0),
		cmocka_unit_test(test_bind_self),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
