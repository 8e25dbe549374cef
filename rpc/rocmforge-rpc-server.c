// rocmforge-rpc-server: serves rocmforge's devices (RFCPU, RFGPU0.., RFHYBRID) to other machines
// through ggml's RPC backend, so that a llama.cpp host started with `--rpc HOST:PORT` runs its
// layers here.
//
//   rocmforge-rpc-server [--host ADDR] [--port N] [--device NAME[,NAME...]] [--threads N] [--cache DIR]
//
// ggml's RPC protocol has no authentication and no encryption: whoever reaches the port can
// read and write the served memory and run graphs. The server warns at start when it is bound to
// anything but loopback.
//
// Stopping: ggml_backend_rpc_start_server() loops on accept() for ever and has no stop call. It
// runs in its own thread; the main thread waits for SIGINT/SIGTERM (blocked in every thread and
// taken with sigwait, so no handler runs inside ggml) and then ends the process with _exit(0): the
// kernel closes the listening socket and the client's connection and frees the devices' memory.
// A client that is connected then sees its connection close. ggml writes a cache file (--cache)
// with no temporary name and reads it back trusting its name (the FNV-1a hash of the contents), so a
// write cut by the stop would serve wrong weights next time: the newest file this run wrote is
// checked against its name before the exit and removed when it does not match.

#include "ggml-backend.h"
#include "ggml-rocmforge.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_DEVICES 16

// ggml_backend_rpc_start_server's signature (ggml-rpc.h of ggml 0.26.0), reached through the RPC
// registry's proc address: with GGML_BACKEND_DL the RPC backend is a module, not a linkable library.
typedef void (*rpc_start_server_fn)(const char * endpoint, const char * cache_dir, size_t n_threads,
                                    size_t n_devices, ggml_backend_dev_t * devices);

struct opts {
    const char * host;
    int port;
    const char * devices;
    int threads;
    const char * cache;
};

struct server_args {
    rpc_start_server_fn start;
    char endpoint[128];
    const char * cache;
    size_t threads;
    size_t n_devices;
    ggml_backend_dev_t devices[MAX_DEVICES];
};

static void usage(FILE * f) {
    fprintf(f,
            "usage: rocmforge-rpc-server [--host ADDR] [--port N] [--device NAME[,NAME...]] [--threads N] [--cache DIR]\n"
            "  --host ADDR     IPv4 address or host name to listen on (default 127.0.0.1)\n"
            "  --port N        TCP port (default 50052; 0: any free port, printed at start)\n"
            "  --device NAMES  rocmforge devices to serve: RFCPU, RFGPU0.., RFHYBRID (default RFCPU)\n"
            "  --threads N     CPU threads of the served devices (default: ROCMFORGE_THREADS or the usable cores)\n"
            "  --cache DIR     ggml's RPC tensor cache: weights a client sent once are read from DIR next time\n"
            "ggml's RPC protocol has no authentication or encryption: listen on loopback or a private network only.\n");
}

static int parse_int(const char * s, int lo, int hi, const char * what) {
    char * end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || !end || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "rocmforge-rpc-server: %s must be a number in %d..%d, got '%s'\n", what, lo, hi, s);
        exit(2);
    }
    return (int) v;
}

static struct opts parse(int argc, char ** argv) {
    struct opts o = { "127.0.0.1", 50052, "RFCPU", 0, NULL };
    for (int i = 1; i < argc; i++) {
        const char * a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        }
        const char * v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "rocmforge-rpc-server: %s needs a value\n", a);
            usage(stderr);
            exit(2);
        }
        if (!strcmp(a, "--host")) o.host = v;
        else if (!strcmp(a, "--port")) o.port = parse_int(v, 0, 65535, "--port");
        else if (!strcmp(a, "--device")) o.devices = v;
        else if (!strcmp(a, "--threads")) o.threads = parse_int(v, 1, 1024, "--threads");
        else if (!strcmp(a, "--cache")) o.cache = v;
        else {
            fprintf(stderr, "rocmforge-rpc-server: unknown option %s\n", a);
            usage(stderr);
            exit(2);
        }
        i++;
    }
    return o;
}

// RFCPU's own default (ROCMFORGE_THREADS, else the cores this process may run on): ggml's server
// sets a thread count on every device it serves, so "not given" must become a number here.
static int default_threads(void) {
    const char * env = getenv("ROCMFORGE_THREADS");
    if (env && atoi(env) > 0) return atoi(env);
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int) n : 1;
}

// ggml's server takes a dotted IPv4 address only; a host name is resolved here.
static bool resolve_ipv4(const char * host, struct in_addr * out) {
    if (inet_pton(AF_INET, host, out) == 1) return true;
    struct addrinfo hints = { 0 }, * res = NULL;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res) return false;
    *out = ((struct sockaddr_in *) res->ai_addr)->sin_addr;
    freeaddrinfo(res);
    return true;
}

// A socket bound to addr:port with SO_REUSEADDR, as ggml binds its own: -errno when the bind fails.
// On Linux two such sockets share a port as long as neither listens, so the one kept open reserves
// the port for ggml's, and a new one fails with EADDRINUSE once ggml listens.
static int bind_probe(struct in_addr addr, int port, int * fd_out) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -errno;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = { 0 };
    sa.sin_family = AF_INET;
    sa.sin_addr = addr;
    sa.sin_port = htons((uint16_t) port);
    if (bind(fd, (struct sockaddr *) &sa, sizeof sa) < 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    if (fd_out) *fd_out = fd;
    else close(fd);
    return 0;
}

static void list_devices(FILE * f, ggml_backend_reg_t reg) {
    for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); i++) {
        ggml_backend_dev_t d = ggml_backend_reg_dev_get(reg, i);
        fprintf(f, "  %s: %s\n", ggml_backend_dev_name(d), ggml_backend_dev_description(d));
    }
}

// The devices named in a comma-separated list; exits with the available ones on an unknown name.
static size_t find_devices(ggml_backend_reg_t reg, const char * names, ggml_backend_dev_t * out) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", names);
    size_t n = 0;
    char * save = NULL;
    for (char * tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        ggml_backend_dev_t found = NULL;
        for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); i++) {
            ggml_backend_dev_t d = ggml_backend_reg_dev_get(reg, i);
            if (!strcmp(ggml_backend_dev_name(d), tok)) found = d;
        }
        if (!found) {
            fprintf(stderr, "rocmforge-rpc-server: unknown device '%s'; available devices:\n", tok);
            list_devices(stderr, reg);
            exit(2);
        }
        if (n == MAX_DEVICES) {
            fprintf(stderr, "rocmforge-rpc-server: at most %d devices\n", MAX_DEVICES);
            exit(2);
        }
        out[n++] = found;
    }
    if (n == 0) {
        fprintf(stderr, "rocmforge-rpc-server: --device names no device; available devices:\n");
        list_devices(stderr, reg);
        exit(2);
    }
    return n;
}

// ggml's RPC registry: already registered (a ggml built without GGML_BACKEND_DL), else
// libggml-rpc.so beside this executable (where ggml installs its backend modules), else wherever
// the dynamic loader finds it.
static rpc_start_server_fn find_rpc_server(void) {
    ggml_backend_reg_t reg = ggml_backend_reg_by_name("RPC");
    if (!reg) {
        char exe[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n > 0) {
            exe[n] = '\0';
            char * slash = strrchr(exe, '/');
            if (slash) {
                char path[PATH_MAX + 32];
                snprintf(path, sizeof path, "%.*s/libggml-rpc.so", (int) (slash - exe), exe);
                if (access(path, R_OK) == 0) reg = ggml_backend_load(path);
            }
        }
    }
    if (!reg) reg = ggml_backend_load("libggml-rpc.so");
    if (!reg) return NULL;
    return (rpc_start_server_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_rpc_start_server");
}

static bool make_dir(const char * dir) {
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char * p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) < 0 && errno != EEXIST) return false;
        *p = '/';
    }
    if (mkdir(buf, 0755) < 0 && errno != EEXIST) return false;
    struct stat st;
    return stat(buf, &st) == 0 && S_ISDIR(st.st_mode) && access(buf, W_OK | X_OK) == 0;
}

// FNV-1a, 64 bits: the hash ggml's RPC names its cache files by (16 hex digits).
static bool file_matches_hash(const char * path, uint64_t want) {
    FILE * f = fopen(path, "rb");
    if (!f) return true;  // gone or unreadable: nothing to repair
    uint64_t h = 0xcbf29ce484222325ull;
    unsigned char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        for (size_t i = 0; i < n; i++) h = (h ^ buf[i]) * 0x100000001b3ull;
    }
    fclose(f);
    return h == want;
}

// The cache file written last since `since` (the one a stop may have cut), checked and removed when
// its contents do not hash to its name.
static void check_last_cache_file(const char * dir, time_t since) {
    DIR * d = opendir(dir);
    if (!d) return;
    char newest[PATH_MAX] = "";
    struct timespec newest_t = { since, 0 };
    uint64_t want = 0;
    struct dirent * e;
    while ((e = readdir(d)) != NULL) {
        if (strlen(e->d_name) != 16 || strspn(e->d_name, "0123456789abcdef") != 16) continue;
        const uint64_t h = strtoull(e->d_name, NULL, 16);
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (st.st_mtim.tv_sec > newest_t.tv_sec ||
            (st.st_mtim.tv_sec == newest_t.tv_sec && st.st_mtim.tv_nsec >= newest_t.tv_nsec)) {
            newest_t = st.st_mtim;
            snprintf(newest, sizeof newest, "%s", path);
            want = h;
        }
    }
    closedir(d);
    if (newest[0] && !file_matches_hash(newest, want)) {
        unlink(newest);
        printf("rocmforge-rpc-server: removed %s, a cache file cut short by the stop\n", newest);
    }
}

static pthread_t main_thread;

// Returns only when ggml's server gave up (it printed why); the main thread is told with SIGUSR1.
static void * serve(void * p) {
    struct server_args * a = p;
    a->start(a->endpoint, a->cache, a->threads, a->n_devices, a->devices);
    pthread_kill(main_thread, SIGUSR1);
    return NULL;
}

int main(int argc, char ** argv) {
    struct opts o = parse(argc, argv);
    setvbuf(stdout, NULL, _IOLBF, 0);  // ggml's server prints with printf; keep the log in order

    struct in_addr addr;
    if (!resolve_ipv4(o.host, &addr)) {
        fprintf(stderr, "rocmforge-rpc-server: cannot resolve '%s' to an IPv4 address\n", o.host);
        return 2;
    }
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &addr, ip, sizeof ip);

    static struct server_args args;
    ggml_backend_reg_t reg = ggml_backend_rocmforge_reg();
    if (!reg) {
        fprintf(stderr, "rocmforge-rpc-server: rocmforge's registry failed to start (see the log above)\n");
        return 1;
    }
    args.n_devices = find_devices(reg, o.devices, args.devices);
    args.threads = (size_t) (o.threads > 0 ? o.threads : default_threads());

    args.start = find_rpc_server();
    if (!args.start) {
        fprintf(stderr, "rocmforge-rpc-server: ggml's RPC backend (libggml-rpc.so) not found beside the executable "
                        "or on the library path; build ggml with GGML_RPC=ON\n");
        return 1;
    }
    if (o.cache) {
        if (!make_dir(o.cache)) {
            fprintf(stderr, "rocmforge-rpc-server: --cache %s: not a writable directory (%s)\n", o.cache, strerror(errno));
            return 2;
        }
        args.cache = o.cache;
    }

    // A clear message for a port in use, before ggml's bare "Failed to create server socket".
    int reserve = -1;
    int rc = bind_probe(addr, o.port, &reserve);
    if (rc == -EADDRINUSE) {
        fprintf(stderr, "rocmforge-rpc-server: port %d on %s is in use (another server?); choose another with --port\n",
                o.port, ip);
        return 1;
    }
    if (rc < 0) {
        fprintf(stderr, "rocmforge-rpc-server: cannot listen on %s:%d: %s\n", ip, o.port, strerror(-rc));
        return 1;
    }
    int port = o.port;
    if (port == 0) {
        struct sockaddr_in sa;
        socklen_t len = sizeof sa;
        getsockname(reserve, (struct sockaddr *) &sa, &len);
        port = ntohs(sa.sin_port);
    }
    snprintf(args.endpoint, sizeof args.endpoint, "%s:%d", ip, port);

    if ((ntohl(addr.s_addr) >> 24) != 127) {
        fprintf(stderr,
                "rocmforge-rpc-server: WARNING: listening on %s, not on loopback. ggml's RPC protocol has no "
                "authentication and no encryption: anyone who reaches this port can read and write the served "
                "devices' memory and run graphs on them. Serve only on a trusted private network.\n",
                ip);
    }

    const time_t started = time(NULL);
    // SIGINT/SIGTERM (and SIGUSR1 from the server thread) are taken by sigwait in this thread only;
    // a client that hangs up mid-send must not end the server with SIGPIPE.
    signal(SIGPIPE, SIG_IGN);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    main_thread = pthread_self();
    pthread_t th;
    if (pthread_create(&th, NULL, serve, &args) != 0) {
        fprintf(stderr, "rocmforge-rpc-server: cannot start the server thread\n");
        return 1;
    }

    // Listening once a second bind to the port fails (ggml's socket then listens).
    bool listening = false;
    for (;;) {
        struct timespec ts = { 0, 20 * 1000 * 1000 };
        int sig = sigtimedwait(&set, NULL, listening ? NULL : &ts);
        if (sig == SIGINT || sig == SIGTERM) {
            printf("rocmforge-rpc-server: %s received, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
            if (args.cache) check_last_cache_file(args.cache, started);
            fflush(stdout);
            fflush(stderr);
            _exit(0);
        }
        if (sig == SIGUSR1) {
            fflush(stdout);
            if (listening) fprintf(stderr, "rocmforge-rpc-server: ggml's RPC server stopped (its message is above)\n");
            else fprintf(stderr, "rocmforge-rpc-server: could not serve on %s (ggml's message is above)\n", args.endpoint);
            _exit(1);
        }
        if (!listening && bind_probe(addr, port, NULL) == -EADDRINUSE) {
            listening = true;
            close(reserve);
            printf("rocmforge-rpc-server: listening on %s (", args.endpoint);
            for (size_t i = 0; i < args.n_devices; i++)
                printf("%s%s", i ? ", " : "", ggml_backend_dev_name(args.devices[i]));
            printf("; %zu thread%s%s%s)\n", args.threads, args.threads == 1 ? "" : "s", args.cache ? ", cache " : "", args.cache ? args.cache : "");
        }
    }
}
