/*
 * The wall clock of a test server, moved by the tests. Preloaded (LD_PRELOAD) into the server's
 * processes, it adds an offset to every reading of CLOCK_REALTIME through clock_gettime,
 * gettimeofday and time. The offset is read at every reading from the file FAKE_CLOCK_FILE names,
 * in seconds with a sign and an optional fraction: "+0", "-0.004", "+1.5".
 *
 * PostgreSQL reads the clock inside its SIGALRM handler, which can interrupt malloc. So everything
 * here is async-signal-safe: raw system calls and the stack only, no stdio, no malloc, no buffer
 * shared between calls, and errno as it was. (libfaketime reads its file with stdio, and corrupts the heap so.)
 * The clocks that measure intervals (CLOCK_MONOTONIC and the rest) are left alone.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define NS_PER_SECOND 1000000000LL

/* A copy: PostgreSQL writes its process titles over the memory its environment came in. */
static char offset_file[4096];

static void die(const char *why)
{
    (void) write(STDERR_FILENO, why, strlen(why));
    abort();
}

__attribute__((constructor)) static void find_offset_file(void)
{
    const char *name = getenv("FAKE_CLOCK_FILE");
    if (name == NULL)
        die("fake clock: FAKE_CLOCK_FILE is not set\n");
    if (strlen(name) >= sizeof offset_file)
        die("fake clock: FAKE_CLOCK_FILE is too long\n");
    strcpy(offset_file, name);
}

/* The offset in the file, in nanoseconds; a file that cannot be read or parsed ends the process. */
static long long offset_ns(void)
{
    char text[64];
    ssize_t length = 0;
    /* A test's COPY ... TO the file truncates it before writing: an empty file is read again, for
     * up to a second. */
    for (int attempt = 0; length == 0 && attempt < 1000; attempt++)
    {
        const struct timespec millisecond = {0, 1000000};
        int fd = open(offset_file, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            die("fake clock: cannot open FAKE_CLOCK_FILE\n");
        length = read(fd, text, sizeof text - 1);
        close(fd);
        if (length == 0)
            nanosleep(&millisecond, NULL);
    }
    if (length <= 0)
        die("fake clock: cannot read FAKE_CLOCK_FILE\n");

    const char *c = text, *end = text + length;
    int sign = 1;
    if (*c == '+' || *c == '-')
        sign = *c++ == '-' ? -1 : 1;
    long long seconds = 0, fraction = 0, scale = NS_PER_SECOND;
    int digits = 0;
    for (; c < end && *c >= '0' && *c <= '9' && seconds < 1000000000LL; c++, digits++)
        seconds = seconds * 10 + (*c - '0');
    if (c < end && *c == '.')
        for (c++; c < end && *c >= '0' && *c <= '9'; c++, digits++)
            if (scale > 1)
                fraction += (*c - '0') * (scale /= 10);
    while (c < end && (*c == '\n' || *c == ' '))
        c++;
    if (digits == 0 || c != end)
        die("fake clock: FAKE_CLOCK_FILE does not hold an offset in seconds such as -0.004\n");
    return sign * (seconds * NS_PER_SECOND + fraction);
}

static int real_clock_gettime(clockid_t clock, struct timespec *ts)
{
    return syscall(SYS_clock_gettime, clock, ts);
}

static void shift(struct timespec *ts, long long by_ns)
{
    long long ns = ts->tv_sec * NS_PER_SECOND + ts->tv_nsec + by_ns;
    ts->tv_sec = ns / NS_PER_SECOND;
    ts->tv_nsec = ns % NS_PER_SECOND;
    if (ts->tv_nsec < 0)
    {
        ts->tv_sec -= 1;
        ts->tv_nsec += NS_PER_SECOND;
    }
}

int clock_gettime(clockid_t clock, struct timespec *ts)
{
    int saved_errno = errno;
    int result = real_clock_gettime(clock, ts);
    if (result == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE))
    {
        shift(ts, offset_ns());
        errno = saved_errno;
    }
    return result;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz)
{
    struct timespec ts;
    (void) tz;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return -1;
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return (time_t) -1;
    if (out != NULL)
        *out = ts.tv_sec;
    return ts.tv_sec;
}
