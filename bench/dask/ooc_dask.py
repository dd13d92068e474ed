#!/usr/bin/env python3
"""The Dask side of `bench ooc`: the same out-of-core job on zarr arrays.

Inputs are generated into zarr arrays on disk first (not timed); the timed
part reads them from disk, computes with the threaded scheduler on
`--threads` workers (BLAS single-threaded in each, as our slaves are) and
writes the result back to zarr, so both systems go disk -> compute -> disk.

Prints one line `RESULT {json}` with the seconds and GFLOP/s.
Run by `bench ooc` inside the virtual environment it creates.
"""

import argparse
import json
import os
import resource
import shutil
import sys
import time


def proc_io():
    """This process's /proc/self/io counters (all its threads); {} where absent."""
    try:
        with open("/proc/self/io") as f:
            return {k: int(v) for k, v in (line.split(":") for line in f if ":" in line)}
    except OSError:
        return {}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--op", choices=["matmul", "cholesky", "lu"], required=True, help="the job")
    p.add_argument("--n", type=int, required=True, help="matrix order")
    p.add_argument("--block", type=int, required=True, help="chunk side (the block size b)")
    p.add_argument("--dir", required=True, help="where the zarr arrays go (removed afterwards)")
    p.add_argument("--threads", type=int, default=2, help="dask worker threads")
    args = p.parse_args()

    # One BLAS thread per dask thread, like one slave per core; must be set
    # before numpy loads its BLAS.
    for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[v] = "1"
    import dask
    import dask.array as da
    import zarr  # noqa: F401  (fail early if missing)

    n, b = args.n, args.block
    os.makedirs(args.dir, exist_ok=True)
    path = lambda name: os.path.join(args.dir, name + ".zarr")  # noqa: E731
    rs = da.random.RandomState(1)
    t_gen = time.perf_counter()
    with dask.config.set(scheduler="threads", num_workers=args.threads):
        if args.op == "matmul":
            rs.random_sample((n, n), chunks=(b, b)).to_zarr(path("A"), overwrite=True)
            da.random.RandomState(2).random_sample((n, n), chunks=(b, b)).to_zarr(path("B"), overwrite=True)
        else:
            r = rs.random_sample((n, n), chunks=(b, b)) * 2 - 1
            if args.op == "cholesky":
                # Symmetric and diagonally dominant: positive definite.
                a = (r + r.T) / 2 + n * da.eye(n, chunks=b)
            else:
                a = r
            a.to_zarr(path("A"), overwrite=True)
    gen_s = time.perf_counter() - t_gen

    io0 = proc_io()
    t0 = time.perf_counter()
    with dask.config.set(scheduler="threads", num_workers=args.threads):
        a = da.from_zarr(path("A"))
        if args.op == "matmul":
            bm = da.from_zarr(path("B"))
            (a @ bm).to_zarr(path("C"), overwrite=True)
            flops = 2.0 * n**3
        elif args.op == "cholesky":
            da.linalg.cholesky(a, lower=True).to_zarr(path("L"), overwrite=True)
            flops = n**3 / 3.0
        else:
            pm, lm, um = da.linalg.lu(a)
            targets = []
            import zarr as z
            for name, x in (("P", pm), ("L", lm), ("U", um)):
                targets.append(z.open(path(name), mode="w", shape=x.shape, chunks=(b, b), dtype=x.dtype))
            da.store([pm, lm, um], targets, lock=False)
            flops = 2.0 * n**3 / 3.0
    secs = time.perf_counter() - t0
    io1 = proc_io()
    shutil.rmtree(args.dir, ignore_errors=True)
    print("RESULT " + json.dumps({
        "op": args.op, "n": n, "block": b, "threads": args.threads,
        "seconds": secs, "gflops": flops / secs / 1e9, "generate_seconds": gen_s,
        "dask": dask.__version__,
        # Storage bytes of the timed part (page-cache hits excluded): under
        # a memory cap, what shows the run was out of core.
        "read_bytes": io1.get("read_bytes", 0) - io0.get("read_bytes", 0),
        "write_bytes": io1.get("write_bytes", 0) - io0.get("write_bytes", 0),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
