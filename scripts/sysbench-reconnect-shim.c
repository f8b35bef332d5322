/* sysbench 1.0.20 reconnects by calling mysql_real_connect() on a handle it has just passed to
 * mysql_close(); with libmariadb (Debian's build) that crashes, even against MariaDB directly
 * (akopytov/sysbench#527). Loaded with LD_PRELOAD, this runs mysql_init() on such a handle first,
 * so that `--mysql-ignore-errors=all` runs survive lost connections (soak and failover tests).
 * Build: gcc -shared -fPIC -O2 -o shim.so sysbench-reconnect-shim.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
static __thread void *closed;
void mysql_close(void *m) {
    ((void (*)(void *))dlsym(RTLD_NEXT, "mysql_close"))(m);
    closed = m;
}
void *mysql_real_connect(void *m, const char *h, const char *u, const char *pw, const char *db,
                         unsigned int port, const char *sock, unsigned long flags) {
    if (m == closed) { ((void *(*)(void *))dlsym(RTLD_NEXT, "mysql_init"))(m); closed = 0; }
    return ((void *(*)(void *, const char *, const char *, const char *, const char *, unsigned int,
                       const char *, unsigned long))dlsym(RTLD_NEXT, "mysql_real_connect"))(m, h, u, pw, db, port, sock, flags);
}
