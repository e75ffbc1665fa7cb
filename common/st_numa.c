/* st_numa.c — see st_numa.h.  All of strata's libnuma calls are here. */
#include "st_numa.h"

#include <errno.h>
#include <numa.h>
#include <numaif.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGE 4096ul
#define QUERY_CHUNK 4096ul /* pages per move_pages call */

int st_numa_node_count(void)
{
	if (numa_available() < 0)
		return 1;
	return numa_max_node() + 1;
}

int st_numa_policy_parse(const char *text, struct st_numa_policy *p,
			 struct st_diag *diag)
{
	char *end;
	long v;

	memset(p, 0, sizeof(*p));
	if (!text || !strcmp(text, "off") || !strcmp(text, "none")) {
		p->mode = ST_NUMA_OFF;
		return 0;
	}
	if (!strcmp(text, "auto")) {
		p->mode = ST_NUMA_AUTO;
		return 0;
	}
	if (!strcmp(text, "interleave")) {
		p->mode = ST_NUMA_INTERLEAVE;
		return 0;
	}
	errno = 0;
	v = strtol(text, &end, 10);
	if (errno || end == text || *end || v < 0 || v >= ST_NUMA_MAX_NODES)
		return st_diag_set(diag, -EINVAL,
				   "--numa '%s': use auto, interleave, off or "
				   "a node number 0..%d (strata topo lists "
				   "the nodes)", text, ST_NUMA_MAX_NODES - 1);
	p->mode = ST_NUMA_NODE;
	p->node = (int)v;
	return 0;
}

const char *st_numa_policy_str(const struct st_numa_policy *p, char *buf,
			       size_t len)
{
	switch (p->mode) {
	case ST_NUMA_OFF: snprintf(buf, len, "off"); break;
	case ST_NUMA_AUTO: snprintf(buf, len, "auto"); break;
	case ST_NUMA_INTERLEAVE: snprintf(buf, len, "interleave"); break;
	case ST_NUMA_NODE: snprintf(buf, len, "node %d", p->node); break;
	}
	return buf;
}

int st_numa_resolve(struct st_numa_policy *p, const struct st_topo *topo,
		    struct st_diag *diag)
{
	struct st_topo *own = NULL;
	int r = 0;

	if (p->mode == ST_NUMA_OFF || p->mode == ST_NUMA_INTERLEAVE)
		return 0;
	if (p->mode == ST_NUMA_AUTO) {
		/* hwloc only here: a daemon given a node number never loads
		 * it (its plugins cost each process about 2 MiB) */
		if (!topo) {
			own = malloc(sizeof(*own));
			if (!own)
				return st_diag_set(diag, -ENOMEM, "out of memory");
			r = st_topo_load(own, diag);
			if (r < 0) {
				free(own);
				return r;
			}
			topo = own;
		}
		p->node = st_topo_pick_node(topo, 0, NULL, 0);
		p->mode = ST_NUMA_NODE;
		free(own);
	}
	if (numa_available() < 0)
		return p->node == 0 ? 0 :
		       st_diag_set(diag, -EINVAL, "--numa %d: this kernel has "
				   "no NUMA support; only node 0 exists",
				   p->node);
	if (p->node > numa_max_node() || numa_node_size64(p->node, NULL) <= 0)
		return st_diag_set(diag, -EINVAL, "--numa %d: %s; this machine "
				   "has nodes 0-%d (strata topo lists them)",
				   p->node, p->node > numa_max_node() ?
				   "no such NUMA node" :
				   "the node has no memory", numa_max_node());
	return 0;
}

/* The node mask with node set (or every node with memory when node < 0). */
static void node_mask(int node, unsigned long *mask, size_t words)
{
	memset(mask, 0, words * sizeof(*mask));
	if (node >= 0) {
		mask[node / (8 * sizeof(long))] |= 1ul << (node % (8 * sizeof(long)));
		return;
	}
	for (int n = 0; n < st_numa_node_count() && n < ST_NUMA_MAX_NODES; n++)
		if (numa_available() < 0 || numa_node_size64(n, NULL) > 0)
			mask[n / (8 * sizeof(long))] |= 1ul << (n % (8 * sizeof(long)));
}

int st_numa_bind_self(struct st_numa_policy *p, char *what, size_t what_len,
		      struct st_diag *diag)
{
	unsigned long mask[ST_NUMA_MAX_NODES / (8 * sizeof(long)) + 1];
	struct bitmask *cpus;
	cpu_set_t set;
	int r, n_cpus = 0, first = -1, last = -1;
	char *w = what;
	size_t wl = what_len;

	if (what && what_len)
		what[0] = 0;
	if (p->mode == ST_NUMA_OFF)
		return 0;
	r = st_numa_resolve(p, NULL, diag);
	if (r < 0)
		return r;
	if (numa_available() < 0)
		return st_diag_set(diag, -ENOSYS, "--numa: this kernel has no "
				   "NUMA support (libnuma: numa_available "
				   "failed); use --numa off");
	CPU_ZERO(&set);
	if (p->mode == ST_NUMA_NODE) {
		cpus = numa_allocate_cpumask();
		if (!cpus || numa_node_to_cpus(p->node, cpus) < 0) {
			numa_free_cpumask(cpus);
			return st_diag_set(diag, -EINVAL, "--numa %d: cannot "
					   "read the node's cpus", p->node);
		}
		for (unsigned i = 0; i < cpus->size && i < CPU_SETSIZE; i++)
			if (numa_bitmask_isbitset(cpus, i))
				CPU_SET(i, &set);
		numa_free_cpumask(cpus);
	} else {
		for (int i = 0; i < CPU_SETSIZE && i < (int)sysconf(_SC_NPROCESSORS_CONF); i++)
			CPU_SET(i, &set);
	}
	/* keep only cpus we may run on (a container's cpuset) */
	{
		cpu_set_t allowed;

		if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0)
			CPU_AND(&set, &set, &allowed);
	}
	for (int i = 0; i < CPU_SETSIZE; i++)
		if (CPU_ISSET(i, &set)) {
			n_cpus++;
			if (first < 0)
				first = i;
			last = i;
		}
	if (!n_cpus)
		return st_diag_set(diag, -EINVAL, "--numa %d: the node has no "
				   "cpu this process may use", p->node);
	if (sched_setaffinity(0, sizeof(set), &set) < 0)
		return st_diag_set(diag, -errno, "sched_setaffinity: %s",
				   strerror(errno));
	node_mask(p->mode == ST_NUMA_NODE ? p->node : -1, mask,
		  sizeof(mask) / sizeof(mask[0]));
	if (set_mempolicy(p->mode == ST_NUMA_NODE ? MPOL_BIND : MPOL_INTERLEAVE,
			  mask, ST_NUMA_MAX_NODES + 1) < 0)
		return st_diag_set(diag, -errno, "set_mempolicy: %s",
				   strerror(errno));
	if (w) {
		if (p->mode == ST_NUMA_NODE)
			snprintf(w, wl, "node %d: %d cpus (%d-%d), memory "
				 "bound to node %d", p->node, n_cpus, first,
				 last, p->node);
		else
			snprintf(w, wl, "interleave: %d cpus, memory "
				 "interleaved over all nodes", n_cpus);
	}
	return 0;
}

int st_numa_daemon_setup(const char *text, struct st_numa_policy *ret,
			 char *what, size_t what_len, struct st_diag *diag)
{
	int r = st_numa_policy_parse(text, ret, diag);

	if (what && what_len)
		what[0] = 0;
	return r < 0 ? r : st_numa_bind_self(ret, what, what_len, diag);
}

int st_numa_bind_range(void *addr, size_t len,
		       const struct st_numa_policy *p, struct st_diag *diag)
{
	unsigned long mask[ST_NUMA_MAX_NODES / (8 * sizeof(long)) + 1];
	size_t plen = (len + PAGE - 1) & ~(PAGE - 1);

	if (p->mode == ST_NUMA_OFF)
		return 0;
	if (p->mode == ST_NUMA_AUTO)
		return st_diag_set(diag, -EINVAL, "st_numa_bind_range: policy "
				   "not resolved");
	if ((uintptr_t)addr % PAGE)
		return st_diag_set(diag, -EINVAL, "mbind: address %p not page "
				   "aligned", addr);
	node_mask(p->mode == ST_NUMA_NODE ? p->node : -1, mask,
		  sizeof(mask) / sizeof(mask[0]));
	if (mbind(addr, plen, p->mode == ST_NUMA_NODE ? MPOL_BIND :
		  MPOL_INTERLEAVE, mask, ST_NUMA_MAX_NODES + 1,
		  MPOL_MF_MOVE) < 0)
		return st_diag_set(diag, -errno, "mbind of %zu bytes: %s", plen,
				   strerror(errno));
	return 0;
}

int st_numa_query_range(const void *addr, size_t len, uint64_t *ret_pages,
			uint64_t *ret_absent)
{
	uintptr_t base = (uintptr_t)addr & ~(PAGE - 1);
	size_t n_pages = ((uintptr_t)addr + len - base + PAGE - 1) / PAGE;
	unsigned char *vec;
	void **pages;
	int *status;
	int r = 0;

	memset(ret_pages, 0, ST_NUMA_MAX_NODES * sizeof(*ret_pages));
	*ret_absent = 0;
	vec = malloc(n_pages ? n_pages : 1);
	pages = malloc(QUERY_CHUNK * sizeof(*pages));
	status = malloc(QUERY_CHUNK * sizeof(*status));
	if (!vec || !pages || !status) {
		r = -ENOMEM;
		goto out;
	}
	if (mincore((void *)base, n_pages * PAGE, vec) < 0) {
		r = -errno;
		goto out;
	}
	for (size_t i = 0; i < n_pages;) {
		unsigned long cnt = 0;

		for (; i < n_pages && cnt < QUERY_CHUNK; i++) {
			if (!(vec[i] & 1)) {
				(*ret_absent)++;
				continue;
			}
			pages[cnt] = (void *)(base + i * PAGE);
			/* a read maps the resident page into our page table
			 * (move_pages only sees mapped pages); it never
			 * allocates one, mincore said it exists */
			(void)*(volatile const char *)pages[cnt];
			cnt++;
		}
		if (!cnt)
			continue;
		if (move_pages(0, cnt, pages, NULL, status, 0) < 0) {
			r = -errno;
			goto out;
		}
		for (unsigned long k = 0; k < cnt; k++) {
			if (status[k] >= 0 && status[k] < ST_NUMA_MAX_NODES)
				ret_pages[status[k]]++;
			else
				(*ret_absent)++;
		}
	}
out:
	free(vec);
	free(pages);
	free(status);
	return r;
}
