/*
 * A preload library that steps a process's wall clock, for the clock-step
 * tests: CLOCK_REALTIME (and its coarse variant), gettimeofday() and time()
 * read the real wall clock plus an offset; every other clock, the monotonic
 * ones included, is left alone.
 *
 * The offset (a signed 64-bit count of milliseconds, native byte order) sits
 * at the start of the file named by CLOCKSHIFT_FILE, which this library maps
 * shared: the test writes the file and the next clock read sees it, with no
 * system call per read beyond the clock's own.
 *
 * Nothing here allocates or calls dlsym: Debian's redis-server links a shared
 * jemalloc, and a preload that resolves symbols with dlsym from inside a
 * clock call (libfaketime does) can re-enter the allocator while it is being
 * initialised and hang. The real clocks are read with the raw system call.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile int64_t *offset_ms;

__attribute__((constructor)) static void clockshift_init(void) {
    const char *path = getenv("CLOCKSHIFT_FILE");
    if (path == NULL)
        return;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    void *map = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map != MAP_FAILED)
        offset_ms = map;
}

static int64_t shift_ms(void) {
    return offset_ms == NULL ? 0 : __atomic_load_n(offset_ms, __ATOMIC_RELAXED);
}

static void shift(struct timespec *ts) {
    int64_t ns = (int64_t)ts->tv_nsec + (shift_ms() % 1000) * 1000000;
    ts->tv_sec += shift_ms() / 1000;
    if (ns < 0) {
        ns += 1000000000;
        ts->tv_sec -= 1;
    } else if (ns >= 1000000000) {
        ns -= 1000000000;
        ts->tv_sec += 1;
    }
    ts->tv_nsec = ns;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    int rc = (int)syscall(SYS_clock_gettime, clock, ts);
    if (rc == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE))
        shift(ts);
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out != NULL)
        *out = ts.tv_sec;
    return ts.tv_sec;
}
