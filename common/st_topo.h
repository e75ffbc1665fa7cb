/*
 * st_topo.h — the machine as strata places an instance on it (DESIGN.md
 * sections 1 and 2: one instance per GPU, or per NUMA node on CPU-only
 * machines; T1 host memory on the node nearest the GPU).
 *
 * The one door to hwloc: NUMA nodes with their cores, memory and caches,
 * and the PCI devices that matter (GPUs, NVMe controllers) with the NUMA
 * node they hang off.  `strata topo` prints it; the daemons' `--numa auto`
 * asks st_topo_pick_node() which node to use.
 */
#ifndef ST_TOPO_H
#define ST_TOPO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "st_error.h"

#define ST_TOPO_MAX_NODES 64
#define ST_TOPO_MAX_DEVS 64

struct st_topo_node {
	int os_index;              /* the kernel's node number */
	uint64_t mem_bytes;        /* local memory of the node */
	int n_cores, n_pus;        /* physical cores, hardware threads */
	char cpus[256];            /* cpu list "0-15,32-47" */
	uint64_t l3_bytes;         /* sum of the L3 caches inside the node */
	int n_l3;
	uint64_t l2_bytes;         /* size of one L2 (0 if none) */
};

enum st_topo_dev_kind { ST_TOPO_GPU = 1, ST_TOPO_NVME = 2 };

struct st_topo_dev {
	enum st_topo_dev_kind kind;
	char pci[16];              /* bus id "0000:65:00.0" */
	char name[64];             /* OS device names ("nvme0n1", "cuda0") or
				    * the vendor:device ids when none */
	uint16_t vendor, device;
	int node;                  /* os_index of the nearest NUMA node, -1
				    * when the machine does not say */
	float link_gbps;           /* PCIe link speed hwloc reports (GB/s),
				    * 0 when unknown */
};

struct st_topo {
	int n_nodes;
	struct st_topo_node nodes[ST_TOPO_MAX_NODES];
	int n_devs;
	struct st_topo_dev devs[ST_TOPO_MAX_DEVS];
	int n_cores, n_pus;        /* whole machine */
	uint64_t mem_bytes;
};

/*
 * Discovers the machine with hwloc (I/O devices included).  Fills *ret
 * (caller-owned, no resources kept).  0, or -ST_E_UNSUPPORTED with diag
 * when hwloc cannot load the topology.  A machine without NUMA nodes in
 * hwloc's view is reported as one node 0 holding everything.
 */
int st_topo_load(struct st_topo *ret, struct st_diag *diag);

/*
 * Which NUMA node an instance should use: the node of GPU number `gpu`
 * (in discovery order) when the machine has GPUs and gpu >= 0; otherwise
 * the node with the most cores (ties: most memory, then lowest number).
 * Writes a one-line reason into why (may be NULL).  Returns the node's
 * os_index (>= 0).
 */
int st_topo_pick_node(const struct st_topo *t, int gpu, char *why,
		      size_t why_len);

/* Index into t->nodes of the node with kernel number os_index, or -1. */
int st_topo_node_index(const struct st_topo *t, int os_index);

/* Prints the topology for people (`strata topo`). */
void st_topo_print(const struct st_topo *t, FILE *f);

#endif
