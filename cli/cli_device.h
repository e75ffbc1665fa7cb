/*
 * cli_device.h — the GPU options of `strata up` and `strata run`
 * (--device-budget, --device-kv-budget, issue 10): checked here, before
 * any daemon starts, then passed through to computed unchanged.
 */
#ifndef CLI_DEVICE_H
#define CLI_DEVICE_H

/*
 * Checks the device options (either may be NULL or "": not given, then
 * computed's defaults apply and nothing is checked).  device_budget: a
 * share of all experts ("25%") or bytes ("40GiB"), "0" for the CPU;
 * device_kv_budget: bytes ("256MiB", "0" = no device KV pool).  When a
 * device pool is asked for (a device budget other than "0", or a device KV
 * budget above 0) the build must have CUDA and a device must be present
 * (STRATA_CUDA_FAKE=1 counts as one): otherwise says why and what to do,
 * in computed's words ("this strata was built without CUDA", "no CUDA
 * device: <reason>").  Returns 0, or 1 after printing "<who>: ..." on
 * stderr.
 */
int cli_check_device(const char *device_budget, const char *device_kv_budget,
		     const char *who);

#endif
