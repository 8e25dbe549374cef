// membw: read bandwidth of this machine's memory, the ceiling for token generation (every
// weight is read once per token). N threads each sum their share of a buffer much larger than
// the caches; the best of several passes is printed in GB/s.
//   membw [THREADS] [MiB]
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct share { const uint8_t * p; size_t n; double sink; };

static void * read_share(void * arg) {
    struct share * s = arg;
    // Four independent loads per step keep enough requests in flight; 64-bit loads are
    // already far faster than memory, so no SIMD is needed (and the program stays portable).
    const uint64_t * p = (const uint64_t *) s->p;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 4 <= s->n / 8; i += 4) {
        a ^= p[i];
        b ^= p[i + 1];
        c ^= p[i + 2];
        d ^= p[i + 3];
    }
    s->sink = (double) (a ^ b ^ c ^ d);
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char ** argv) {
    int nth = argc > 1 ? atoi(argv[1]) : 2;
    size_t bytes = (size_t) (argc > 2 ? atoi(argv[2]) : 1024) << 20;
    if (nth < 1 || nth > 256 || bytes == 0) { fprintf(stderr, "usage: membw [THREADS] [MiB]\n"); return 1; }
    uint8_t * buf = aligned_alloc(4096, bytes);
    if (!buf) { perror("alloc"); return 1; }
    memset(buf, 1, bytes);
    double best = 0;
    for (int pass = 0; pass < 5; pass++) {
        pthread_t th[256];
        struct share sh[256];
        size_t per = bytes / nth / 128 * 128;
        double t0 = now();
        for (int i = 0; i < nth; i++) {
            sh[i] = (struct share) { buf + i * per, per, 0 };
            pthread_create(&th[i], NULL, read_share, &sh[i]);
        }
        for (int i = 0; i < nth; i++) pthread_join(th[i], NULL);
        double gbs = per * nth / (now() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    printf("membw threads=%d buffer=%zuMiB read=%.2f GB/s\n", nth, bytes >> 20, best);
    free(buf);
    return 0;
}
