/* st_sdnotify.c — see st_sdnotify.h.
 *
 * libsystemd is opened with dlopen only when $NOTIFY_SOCKET says systemd
 * listens: linking it into every daemon would load it and its own
 * libraries (about 1 MiB of resident memory per daemon, measured with
 * tests/appliance/test_plan_measured.sh) on every start, systemd or not. */
#include "st_sdnotify.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "st_build_config.h"

#if ST_HAVE_LIBSYSTEMD
#include <dlfcn.h>
#include <systemd/sd-daemon.h>

static int notify(const char *msg)
{
	typeof(sd_notify) *fn;
	void *lib;
	int r;

	if (!getenv("NOTIFY_SOCKET"))
		return 0;
	lib = dlopen("libsystemd.so.0", RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		return -ENOENT;
	fn = (typeof(sd_notify) *)dlsym(lib, "sd_notify");
	r = fn ? fn(0, msg) : -ENOSYS;
	dlclose(lib);
	return r;
}

int st_sd_notify_ready(const char *status)
{
	char msg[256];

	snprintf(msg, sizeof(msg), "READY=1\nSTATUS=%s",
		 status ? status : "ready");
	return notify(msg);
}

int st_sd_notify_stopping(void)
{
	return notify("STOPPING=1");
}
#else
int st_sd_notify_ready(const char *status)
{
	(void)status;
	return 0;
}

int st_sd_notify_stopping(void)
{
	return 0;
}
#endif
