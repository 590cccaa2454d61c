/*
 * The wall clock of a test server, moved by the tests. Preloaded (LD_PRELOAD) into the server's
 * processes, it adds an offset to every reading of CLOCK_REALTIME and CLOCK_REALTIME_COARSE through
 * clock_gettime, and to gettimeofday and time. The offset is read at every reading from the file
 * FAKE_CLOCK_FILE names, in seconds with an optional sign and fraction: "+0", "-0.004", "1.5".
 * Every other clock (CLOCK_BOOTTIME, which times waits and leases, among them) is left alone.
 *
 * PostgreSQL reads the clock inside its SIGALRM handler, which can interrupt malloc. So everything
 * on the clock's path is async-signal-safe: raw system calls, the stack, one lock-free atomic, no
 * stdio and no malloc, and errno as it was. (libfaketime reads its file with stdio there, and
 * corrupts the heap so.)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define NS_PER_SECOND 1000000000LL

/* A copy: PostgreSQL writes its process titles over the memory its environment came in. Empty until
 * the constructor ran: another library's constructor that reads the clock first sees it unmoved. */
static char offset_file[4096];

/* libc's clock_gettime (the vDSO's speed), or the system call where it cannot be found. */
static int (*real_clock_gettime)(clockid_t, struct timespec *);

/* The last offset read. A test's COPY ... TO the file truncates it before writing: a reading that
 * finds it empty keeps the offset it had. Inherited by every child of the postmaster. */
static _Atomic long long last_offset_ns;
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "a lock-free atomic, for use in signal handlers");

static void die(const char *why)
{
    if (write(STDERR_FILENO, why, strlen(why)) < 0)
    {
        /* Nowhere else to say it. */
    }
    abort();
}

__attribute__((constructor)) static void load(void)
{
    const char *name = getenv("FAKE_CLOCK_FILE");
    if (name == NULL)
        die("fake clock: FAKE_CLOCK_FILE is not set\n");
    if (strlen(name) >= sizeof offset_file)
        die("fake clock: FAKE_CLOCK_FILE is too long\n");
    real_clock_gettime = (int (*)(clockid_t, struct timespec *)) dlsym(RTLD_NEXT, "clock_gettime");
    strcpy(offset_file, name);
}

/* The offset in the file, in nanoseconds; a file that cannot be read or parsed ends the process. */
static long long offset_ns(void)
{
    char text[64];
    if (offset_file[0] == '\0')
        return 0;
    int fd = open(offset_file, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        die("fake clock: cannot open FAKE_CLOCK_FILE\n");
    ssize_t length = read(fd, text, sizeof text - 1);
    close(fd);
    if (length < 0)
        die("fake clock: cannot read FAKE_CLOCK_FILE\n");
    if (length == 0)
        return atomic_load(&last_offset_ns);

    const char *c = text, *end = text + length;
    int sign = 1;
    if (*c == '+' || *c == '-')
        sign = *c++ == '-' ? -1 : 1;
    long long seconds = 0, fraction = 0, scale = NS_PER_SECOND;
    int digits = 0, whole_digits = 0;
    for (; c < end && *c >= '0' && *c <= '9' && whole_digits < 9; c++, digits++, whole_digits++)
        seconds = seconds * 10 + (*c - '0');
    if (c < end && *c == '.')
        for (c++; c < end && *c >= '0' && *c <= '9'; c++, digits++)
            if (scale > 1)
                fraction += (*c - '0') * (scale /= 10);
    while (c < end && (*c == '\n' || *c == ' '))
        c++;
    if (digits == 0 || c != end)
        die("fake clock: FAKE_CLOCK_FILE does not hold an offset in seconds, such as -0.004, "
            "of at most 9 digits before the point\n");
    long long offset = sign * (seconds * NS_PER_SECOND + fraction);
    atomic_store(&last_offset_ns, offset);
    return offset;
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
    int result = real_clock_gettime != NULL ? real_clock_gettime(clock, ts)
                                            : syscall(SYS_clock_gettime, clock, ts);
    if (result == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE))
    {
        int saved_errno = errno;
        shift(ts, offset_ns());
        errno = saved_errno;
    }
    return result;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return -1;
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    if (tz != NULL)
        memset(tz, 0, sizeof(struct timezone));
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
