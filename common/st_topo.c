/* st_topo.c — see st_topo.h.  All of strata's hwloc calls are here. */
#include "st_topo.h"

#include <hwloc.h>
#include <string.h>

#include "st_util.h"

/* PCI class codes (PCI Code and ID Assignment spec): 0x0300 VGA, 0x0302
 * 3D controller (datacenter GPUs), 0x0108 NVM Express. */
static int dev_kind(const struct hwloc_pcidev_attr_s *p)
{
	if (p->class_id == 0x0302 ||
	    (p->class_id == 0x0300 && (p->vendor_id == 0x10de ||
				       p->vendor_id == 0x1002)))
		return ST_TOPO_GPU;
	if (p->class_id == 0x0108)
		return ST_TOPO_NVME;
	return 0;
}

/* os_index of the first NUMA node near obj (an I/O object), or -1. */
static int io_node(hwloc_topology_t topo, hwloc_obj_t obj)
{
	hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo, obj);
	int n;

	if (!anc || !anc->nodeset)
		return -1;
	/* the root's nodeset covers every node: locality unknown unless the
	 * machine has only one */
	if (anc->type == HWLOC_OBJ_MACHINE &&
	    hwloc_bitmap_weight(anc->nodeset) > 1)
		return -1;
	n = hwloc_bitmap_first(anc->nodeset);
	return n;
}

static void add_dev(struct st_topo *t, hwloc_topology_t topo, hwloc_obj_t pci)
{
	const struct hwloc_pcidev_attr_s *p = &pci->attr->pcidev;
	struct st_topo_dev *d;
	int kind = dev_kind(p);
	size_t used = 0;

	if (!kind || t->n_devs >= ST_TOPO_MAX_DEVS)
		return;
	d = &t->devs[t->n_devs++];
	memset(d, 0, sizeof(*d));
	d->kind = kind;
	d->vendor = p->vendor_id;
	d->device = p->device_id;
	d->link_gbps = p->linkspeed;
	snprintf(d->pci, sizeof(d->pci), "%04x:%02x:%02x.%01x", p->domain,
		 p->bus, p->dev, p->func);
	d->node = io_node(topo, pci);
	for (hwloc_obj_t c = pci->io_first_child; c; c = c->next_sibling) {
		int n;

		if (c->type != HWLOC_OBJ_OS_DEVICE || !c->name)
			continue;
		n = snprintf(d->name + used, sizeof(d->name) - used, "%s%s",
			     used ? "," : "", c->name);
		if (n < 0 || (size_t)n >= sizeof(d->name) - used)
			break;
		used += (size_t)n;
	}
	if (!used)
		snprintf(d->name, sizeof(d->name), "%04x:%04x", p->vendor_id,
			 p->device_id);
}

static void fill_node(struct st_topo_node *n, hwloc_topology_t topo,
		      hwloc_cpuset_t cpus)
{
	int depth;

	n->n_cores = hwloc_get_nbobjs_inside_cpuset_by_type(topo, cpus,
							    HWLOC_OBJ_CORE);
	n->n_pus = hwloc_get_nbobjs_inside_cpuset_by_type(topo, cpus,
							  HWLOC_OBJ_PU);
	hwloc_bitmap_list_snprintf(n->cpus, sizeof(n->cpus), cpus);
	depth = hwloc_get_type_depth(topo, HWLOC_OBJ_L3CACHE);
	if (depth >= 0) {
		hwloc_obj_t c = NULL;

		while ((c = hwloc_get_next_obj_inside_cpuset_by_depth(
				topo, cpus, depth, c))) {
			n->l3_bytes += c->attr->cache.size;
			n->n_l3++;
		}
	}
	{
		hwloc_obj_t c = hwloc_get_next_obj_inside_cpuset_by_type(
			topo, cpus, HWLOC_OBJ_L2CACHE, NULL);

		if (c)
			n->l2_bytes = c->attr->cache.size;
	}
}

int st_topo_load(struct st_topo *t, struct st_diag *diag)
{
	hwloc_topology_t topo;
	hwloc_obj_t o = NULL;
	int nn;

	memset(t, 0, sizeof(*t));
	if (hwloc_topology_init(&topo) < 0)
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "hwloc cannot initialise a topology");
	hwloc_topology_set_io_types_filter(topo,
					   HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
	if (hwloc_topology_load(topo) < 0) {
		hwloc_topology_destroy(topo);
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "hwloc cannot read this machine's topology "
				   "(is /sys mounted?)");
	}
	t->n_cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
	t->n_pus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
	nn = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
	while ((o = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, o)) &&
	       t->n_nodes < ST_TOPO_MAX_NODES) {
		struct st_topo_node *n = &t->nodes[t->n_nodes++];

		n->os_index = (int)o->os_index;
		n->mem_bytes = o->attr->numanode.local_memory;
		t->mem_bytes += n->mem_bytes;
		fill_node(n, topo, o->cpuset);
	}
	if (nn <= 0) { /* no NUMA in hwloc's view: one node, everything */
		hwloc_obj_t root = hwloc_get_root_obj(topo);
		struct st_topo_node *n = &t->nodes[t->n_nodes++];

		n->os_index = 0;
		n->mem_bytes = root->total_memory;
		t->mem_bytes = n->mem_bytes;
		fill_node(n, topo, root->cpuset);
	}
	o = NULL;
	while ((o = hwloc_get_next_pcidev(topo, o)))
		add_dev(t, topo, o);
	hwloc_topology_destroy(topo);
	return 0;
}

int st_topo_node_index(const struct st_topo *t, int os_index)
{
	for (int i = 0; i < t->n_nodes; i++)
		if (t->nodes[i].os_index == os_index)
			return i;
	return -1;
}

int st_topo_pick_node(const struct st_topo *t, int gpu, char *why,
		      size_t why_len)
{
	int best = 0, seen = 0;

	if (gpu >= 0)
		for (int i = 0; i < t->n_devs; i++) {
			const struct st_topo_dev *d = &t->devs[i];

			if (d->kind != ST_TOPO_GPU || seen++ != gpu)
				continue;
			if (d->node >= 0) {
				if (why)
					snprintf(why, why_len, "node %d is "
						 "nearest GPU %d (%s, PCI %s)",
						 d->node, gpu, d->name,
						 d->pci);
				return d->node;
			}
			break;
		}
	for (int i = 1; i < t->n_nodes; i++) {
		const struct st_topo_node *a = &t->nodes[i], *b = &t->nodes[best];

		if (a->n_cores > b->n_cores ||
		    (a->n_cores == b->n_cores && a->mem_bytes > b->mem_bytes))
			best = i;
	}
	if (why) {
		if (t->n_nodes == 1)
			snprintf(why, why_len, "node %d is the only NUMA node "
				 "(placement binds to it and changes nothing "
				 "else)", t->nodes[0].os_index);
		else
			snprintf(why, why_len, "node %d has the most cores "
				 "and memory%s", t->nodes[best].os_index,
				 seen ? "" : " (no GPU found)");
	}
	return t->nodes[best].os_index;
}

void st_topo_print(const struct st_topo *t, FILE *f)
{
	char a[32], b[32], why[256];
	int gpus = 0;

	fprintf(f, "machine: %d NUMA node%s, %d cores, %d hardware threads, "
		"%s memory\n", t->n_nodes, t->n_nodes == 1 ? "" : "s",
		t->n_cores, t->n_pus, st_format_bytes(t->mem_bytes, a,
						      sizeof(a)));
	for (int i = 0; i < t->n_nodes; i++) {
		const struct st_topo_node *n = &t->nodes[i];

		fprintf(f, "node %d: %s memory, %d cores / %d threads (cpus "
			"%s)", n->os_index,
			st_format_bytes(n->mem_bytes, a, sizeof(a)), n->n_cores,
			n->n_pus, n->cpus);
		if (n->n_l3)
			fprintf(f, ", L3 %d x %s", n->n_l3,
				st_format_bytes(n->l3_bytes / (uint64_t)n->n_l3,
						a, sizeof(a)));
		if (n->l2_bytes)
			fprintf(f, ", L2 %s per core",
				st_format_bytes(n->l2_bytes, b, sizeof(b)));
		fputc('\n', f);
	}
	for (int i = 0; i < t->n_devs; i++) {
		const struct st_topo_dev *d = &t->devs[i];
		char node[32];

		if (d->node >= 0)
			snprintf(node, sizeof(node), "node %d", d->node);
		else
			snprintf(node, sizeof(node), "node unknown");
		fprintf(f, "%-4s %s  PCI %s  %s", d->kind == ST_TOPO_GPU ?
			"GPU" : "NVMe", d->name, d->pci, node);
		if (d->link_gbps > 0)
			fprintf(f, "  link %.1f GB/s", d->link_gbps);
		fputc('\n', f);
		gpus += d->kind == ST_TOPO_GPU;
	}
	if (!t->n_devs)
		fprintf(f, "no GPU or NVMe device found on PCI\n");
	st_topo_pick_node(t, gpus ? 0 : -1, why, sizeof(why));
	fprintf(f, "instance placement: --numa %d (%s)\n",
		st_topo_pick_node(t, gpus ? 0 : -1, NULL, 0), why);
	if (gpus > 1)
		for (int g = 1; g < gpus; g++) {
			st_topo_pick_node(t, g, why, sizeof(why));
			fprintf(f, "  instance for GPU %d: %s\n", g, why);
		}
}
