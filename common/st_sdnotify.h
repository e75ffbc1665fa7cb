/*
 * st_sdnotify.h — readiness and stopping notifications to systemd for the
 * daemons run by the unit templates in systemd/ (Type=notify).  The one
 * door to libsystemd, which is optional: a build without it (meson finds
 * no libsystemd) compiles these to nothing, and the units must then use
 * Type=simple.  Outside systemd ($NOTIFY_SOCKET unset) they do nothing.
 */
#ifndef ST_SDNOTIFY_H
#define ST_SDNOTIFY_H

/* Tells systemd the daemon is ready (it answers PING now), with a one-line
 * status.  Returns 1 when sent, 0 when not under systemd or built without
 * libsystemd, or a negative errno. */
int st_sd_notify_ready(const char *status);

/* Tells systemd the daemon is stopping.  Same returns. */
int st_sd_notify_stopping(void);

#endif
