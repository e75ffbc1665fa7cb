/* st_sdnotify.c — see st_sdnotify.h. */
#include "st_sdnotify.h"

#include <stdio.h>

#include "st_build_config.h"

#if ST_HAVE_LIBSYSTEMD
#include <systemd/sd-daemon.h>

int st_sd_notify_ready(const char *status)
{
	return sd_notifyf(0, "READY=1\nSTATUS=%s", status ? status : "ready");
}

int st_sd_notify_stopping(void)
{
	return sd_notify(0, "STOPPING=1");
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
