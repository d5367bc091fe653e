"""A subspace's featurize: the Woodbury Cayley form against the d × d definition, side by side in one run.

``Subspace.basis()`` is recomputed on every access (a cached basis would be
stale the moment an optimizer stepped), so every read and write through a
subspace pays for Q = (I − A)⁻¹(I + A)E once. ``cayley`` takes the inverse by
Woodbury (A has rank 2k): one 2k × 2k solve, O(d·k²). ``cayley_direct`` is the
definition, a d × d solve, O(d³). This times one ``featurize`` of 32 rows at
d = 4096, k = 16 both ways — the direct one through a Subspace whose ``basis``
is ``cayley_direct`` of the same parameter, checked to agree first — then how
the Woodbury time grows with k and with d.

Single-threaded (``torch.set_num_threads(1)``) so the figures are the
arithmetic and not the scheduler; medians of ``--rounds`` timed calls after a
warm-up, the two variants taking turns. It prints only; nothing is held to a time.

    python benchmarks/featurizers.py
    python benchmarks/featurizers.py --rounds 9
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script from anywhere: the checkout's package

import torch  # noqa: E402

from causalab_mini.ops.featurizers import Subspace, cayley_direct  # noqa: E402

ROWS = 32


class DirectSubspace(Subspace):
    """The same parameter and featurize, with Q by the d × d solve."""

    def basis(self):
        return cayley_direct(self.weight)


def subspace(d: int, k: int, cls=Subspace):
    return cls(d, k, seed=0)


def x_for(d: int) -> torch.Tensor:
    return torch.randn(ROWS, d, generator=torch.Generator().manual_seed(1))


def once(sub, x) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        sub.featurize(x)
    return time.perf_counter() - start


def medians(variants: dict, rounds: int, warmup: int = 1, burst: dict = None) -> dict[str, float]:
    """``variants``: name -> (subspace, x). Warm each up, then take turns for ``rounds``; the median seconds of each.

    ``burst[name]`` calls of a variant per turn (default 1), every one timed: a
    sub-millisecond variant gets enough samples while a seconds-long one runs
    ``rounds`` times, and they still alternate.
    """
    burst = burst or {}
    for sub, x in variants.values():
        for _ in range(warmup):
            once(sub, x)
    times: dict[str, list] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (sub, x) in variants.items():
            times[name].extend(once(sub, x) for _ in range(burst.get(name, 1)))
    return {name: statistics.median(t) for name, t in times.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds of the side-by-side: the d x d variant is called once a round (default 5)")
    parser.add_argument("--fast-rounds", type=int, default=101,
                        help="timed calls of each Woodbury-only measurement (default 101)")
    opts = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"featurize of {ROWS} rows through a subspace; torch {torch.__version__}, "
          f"torch.set_num_threads(1) (single-threaded), median after a warm-up", flush=True)

    d, k = 4096, 16
    fast, direct = subspace(d, k), subspace(d, k, DirectSubspace)
    x = x_for(d)
    with torch.no_grad():
        (fa, ea), (fb, eb) = fast.featurize(x), direct.featurize(x)
    diff = max((fa - fb).abs().max().item(), (ea - eb).abs().max().item())
    if diff > 1e-4:
        raise SystemExit(f"the two forms disagree by {diff:.3e}: not timing a wrong answer")
    t = medians({"woodbury": (fast, x), "direct": (direct, x)}, opts.rounds, warmup=3, burst={"woodbury": 21})
    print(f"\nd={d}, k={k} ({opts.rounds} rounds, woodbury 21 calls a round; "
          f"the two agree to {diff:.1e}):")
    print(f"  woodbury (2k x 2k solve)  {t['woodbury'] * 1e3:10.3f} ms")
    print(f"  direct   (d x d solve)    {t['direct'] * 1e3:10.3f} ms")
    print(f"  direct / woodbury         {t['direct'] / t['woodbury']:10.0f}x")

    # Each scan's variants take turns too, so a drift in the machine's speed lands on all of them.
    print(f"\nwoodbury, growth with k at d=4096 ({opts.fast_rounds} rounds):")
    x = x_for(4096)
    ks = medians({k: (subspace(4096, k), x) for k in (4, 8, 16, 32)}, opts.fast_rounds, warmup=5)
    for k, sec in ks.items():
        print(f"  k={k:<3} {sec * 1e3:8.3f} ms   x{sec / ks[4]:5.2f} of k=4")
    print(f"\nwoodbury, growth with d at k=16 ({opts.fast_rounds} rounds):")
    ds = medians({d: (subspace(d, 16), x_for(d)) for d in (1024, 2048, 4096)}, opts.fast_rounds, warmup=5)
    for d, sec in ds.items():
        print(f"  d={d:<5} {sec * 1e3:8.3f} ms   x{sec / ds[1024]:5.2f} of d=1024")
    return 0


if __name__ == "__main__":
    sys.exit(main())
