/*
 * cw_threads.h — a persistent pool of worker threads for computed's kernels
 * (no per-op thread creation).  A job is split into n_tasks tasks; task t
 * is run by exactly one thread.  Splitting a matvec by output rows keeps
 * every output element's reduction order, so results do not depend on the
 * thread count (DESIGN.md 6a).
 */
#ifndef CW_THREADS_H
#define CW_THREADS_H

struct cw_threads;

/* fn(arg, task, n_tasks) is called once per task. */
typedef void (*cw_task_fn)(void *arg, int task, int n_tasks);

/* Starts n_threads - 1 workers (the caller is the n-th).  n_threads >= 1.
 * When the process may run on at least n_threads CPUs, thread i is pinned
 * to the i-th allowed CPU: workers at start, the calling thread (the one
 * that will call cw_threads_run) here; pinning failures are ignored.
 * The calling thread's CPU mask from before is kept and given back by
 * cw_threads_destroy (so a later pool sees every allowed CPU again).
 * Idle workers spin about 0.1 ms on a new job before sleeping; a job's
 * start and end take the mutex only when a thread sleeps.
 * *ret owned by the caller.  0, -EINVAL, -ENOMEM or -errno. */
int cw_threads_create(int n_threads, struct cw_threads **ret);
/* Stops and joins the workers; called on the thread that created the
 * pool, gives that thread back its CPU mask from before
 * cw_threads_create.  NULL is fine. */
void cw_threads_destroy(struct cw_threads *p);
int cw_threads_count(const struct cw_threads *p);

/* Runs tasks 0 .. n_tasks-1 across the pool and returns when all are done.
 * Not reentrant: one job at a time (computed's compute loop). */
void cw_threads_run(struct cw_threads *p, cw_task_fn fn, void *arg,
		    int n_tasks);

#endif
