/* ScaLAPACK pdgemm, C = A·B in core on a BLACS grid of the MPI ranks, for
 * `bench ooc matmul --hosts N --scalapack` (compiled at bench time with
 * mpicc against Debian's libscalapack-openmpi). Arguments: n, nb, reps.
 * Rank 0 prints one JSON line with the fastest rep. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

extern void Cblacs_pinfo(int *, int *);
extern void Cblacs_get(int, int, int *);
extern void Cblacs_gridinit(int *, const char *, int, int);
extern void Cblacs_gridinfo(int, int *, int *, int *, int *);
extern void Cblacs_gridexit(int);
extern int numroc_(const int *, const int *, const int *, const int *, const int *);
extern void descinit_(int *, const int *, const int *, const int *, const int *, const int *, const int *, const int *,
                      const int *, int *);
extern void pdgemm_(const char *, const char *, const int *, const int *, const int *, const double *, const double *,
                    const int *, const int *, const int *, const double *, const int *, const int *, const int *,
                    const double *, double *, const int *, const int *, const int *);

static unsigned long long state;
static double next(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return (double)(state >> 11) / 9007199254740992.0 - 0.5;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    if (argc < 3) {
        fprintf(stderr, "usage: pdgemm N NB [REPS]\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int n = atoi(argv[1]), nb = atoi(argv[2]), reps = argc > 3 ? atoi(argv[3]) : 1;
    int me, np;
    Cblacs_pinfo(&me, &np);
    /* The squarest grid of np ranks. */
    int pr = 1;
    for (int i = 1; i * i <= np; i++)
        if (np % i == 0) pr = i;
    int pc = np / pr, ctx, myr, myc;
    Cblacs_get(-1, 0, &ctx);
    Cblacs_gridinit(&ctx, "Row", pr, pc);
    Cblacs_gridinfo(ctx, &pr, &pc, &myr, &myc);
    int zero = 0, one = 1, info;
    int mloc = numroc_(&n, &nb, &myr, &zero, &pr), nloc = numroc_(&n, &nb, &myc, &zero, &pc);
    int lld = mloc > 1 ? mloc : 1, desc[9];
    descinit_(desc, &n, &n, &nb, &nb, &zero, &zero, &ctx, &lld, &info);
    size_t sz = (size_t)mloc * (size_t)nloc;
    double *a = malloc(sz * sizeof(double) + 8), *b = malloc(sz * sizeof(double) + 8), *c = malloc(sz * sizeof(double) + 8);
    if (!a || !b || !c) {
        fprintf(stderr, "rank %d: cannot hold %zu doubles three times\n", me, sz);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    state = 88172645463325252ULL + (unsigned long long)me * 7919ULL;
    for (size_t i = 0; i < sz; i++) {
        a[i] = next();
        b[i] = next();
        c[i] = 0.0;
    }
    double alpha = 1.0, beta = 0.0, best = 1e300;
    for (int r = 0; r < reps; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t = MPI_Wtime();
        pdgemm_("N", "N", &n, &n, &n, &alpha, a, &one, &one, desc, b, &one, &one, desc, &beta, c, &one, &one, desc);
        MPI_Barrier(MPI_COMM_WORLD);
        t = MPI_Wtime() - t;
        if (t < best) best = t;
    }
    if (me == 0)
        printf("{\"n\": %d, \"nb\": %d, \"p\": %d, \"grid\": \"%dx%d\", \"seconds\": %f, \"gflops\": %f}\n", n, nb, np, pr, pc,
               best, 2.0 * (double)n * n * n / best / 1e9);
    Cblacs_gridexit(ctx);
    MPI_Finalize();
    return 0;
}
