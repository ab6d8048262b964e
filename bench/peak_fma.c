/* Float32 FMA throughput of this CPU: the compute peak for bench/floor.py.
 *
 * Each thread runs 12 independent chains of vector fused multiply-adds (enough to hide the
 * FMA latency on two pipes), so the loop is bound by FMA throughput alone: no memory traffic.
 * FLOPs = threads x iterations x chains x lanes x 2. Built by floor.py with
 *   cc -O2 -march=native -pthread peak_fma.c -o peak_fma
 * Usage: peak_fma THREADS ITERATIONS  ->  prints "<lanes> <seconds> <gflops>"
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#if defined(__AVX512F__)
typedef __m512 vec;
#define LANES 16
#define SET1 _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define ADD _mm512_add_ps
#define STORE _mm512_storeu_ps
#elif defined(__FMA__)
typedef __m256 vec;
#define LANES 8
#define SET1 _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#define ADD _mm256_add_ps
#define STORE _mm256_storeu_ps
#else
#error "needs FMA (x86-64 with AVX2/FMA or AVX-512)"
#endif

#define CHAINS 12

typedef struct { long iterations; float result; } job_t;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *run(void *arg) {
  job_t *job = (job_t *)arg;
  const vec m = SET1(0.99999f), c = SET1(1e-6f);
  vec x[CHAINS];
  for (int k = 0; k < CHAINS; ++k) x[k] = SET1(1.0f + k * 1e-3f);
  for (long i = 0; i < job->iterations; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < CHAINS; ++k) x[k] = FMA(x[k], m, c);
  }
  vec sum = x[0];
  for (int k = 1; k < CHAINS; ++k) sum = ADD(sum, x[k]);
  float lanes[LANES];
  STORE(lanes, sum);
  job->result = lanes[0];
  return NULL;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  long iterations = argc > 2 ? atol(argv[2]) : 100000000L;
  pthread_t tid[256];
  job_t jobs[256];
  if (threads < 1 || threads > 256) return 2;
  double start = now();
  for (int t = 0; t < threads; ++t) {
    jobs[t].iterations = iterations;
    pthread_create(&tid[t], NULL, run, &jobs[t]);
  }
  float check = 0;
  for (int t = 0; t < threads; ++t) {
    pthread_join(tid[t], NULL);
    check += jobs[t].result;
  }
  double seconds = now() - start;
  double flops = (double)threads * iterations * CHAINS * LANES * 2.0;
  printf("%d %.6f %.3f %g\n", LANES, seconds, flops / seconds / 1e9, check);
  return 0;
}
